"""Emergency saves against a deadline: how long until the kill, and the most that fits. Pure.

A time-limit warning (the job's warning signal, or submitit's USR2) comes `signal_lead_s` before
the end (Slurm may send it up to 30 s earlier, which only adds time); a SIGTERM leaves the
partition's GraceTime (KillWait on scancel) before SIGKILL. Whatever is chosen must also leave
time to requeue and exit: a save cut off by SIGKILL costs nothing on disk (it never commits), but
the job then never requeues itself, so a save that cannot fit is not started.

Levers, from most to least kept: the whole state, copied to the cold tier before exiting; the whole
state, hot tier only (the copy happens at the next start); the weights only, without the pre-commit
structure check (the optimizer restarts cold on resume); nothing (the newest checkpoint stays).
"""

from __future__ import annotations

from dataclasses import dataclass

MARGIN = 1.5
"""Estimates are multiplied by this: storage speed swings between saves."""
WARNING_SIGNALS = ("SIGUSR1", "SIGUSR2")


@dataclass(frozen=True)
class EmergencyPlan:
    save: bool
    optimizer: bool
    check: bool
    """Rank 0's structural check of the written files before the marker."""
    cold_copy: bool
    """Copy to the cold tier before exiting (otherwise the next attempt does)."""
    budget_s: float | None
    """Seconds available for the save (None: no deadline known)."""
    estimate_s: float
    """Estimated seconds of the chosen plan, margin included."""
    reason: str

    @property
    def name(self) -> str:
        if not self.save:
            return "none"
        return ("full" if self.optimizer else "weights-only") + ("+cold" if self.cold_copy else "")


def grace_s(signal_name: str | None, warning_signal: str, warning_lead_s: float, term_grace_s: float) -> float | None:
    """Seconds from the signal to the kill; None for a stop with no known deadline.

    `warning_signal` is the job's configured one (`cluster.signal`, e.g. "USR1")."""
    if signal_name == "SIGTERM":
        # A job warned by SIGTERM cannot tell the warning from a preemption: assume the shorter.
        return min(warning_lead_s, term_grace_s) if warning_signal == "TERM" else term_grace_s
    if signal_name in WARNING_SIGNALS:
        return warning_lead_s
    return None


def choose_plan(
    budget_s: float | None, full_bytes: int, weights_bytes: int, write_bytes_per_s: float,
    inflight_s: float, cold_bytes_per_s: float | None,
) -> EmergencyPlan:
    """The first plan whose estimate fits `budget_s` (time left after the reserve).

    `inflight_s`: estimated time left of a background save that must finish first.
    `cold_bytes_per_s`: None when there is no cold tier.
    """
    full = full_bytes / write_bytes_per_s
    cold = full_bytes / cold_bytes_per_s if cold_bytes_per_s else None
    candidates = []
    if cold is not None:
        candidates.append((EmergencyPlan(True, True, True, True, budget_s, 0.0, ""), full + cold))
    candidates += [
        (EmergencyPlan(True, True, True, False, budget_s, 0.0, ""), full),
        (EmergencyPlan(True, False, False, False, budget_s, 0.0, ""), weights_bytes / write_bytes_per_s),
    ]
    for plan, seconds in candidates:
        estimate = inflight_s + MARGIN * seconds
        if budget_s is None or estimate <= budget_s:
            why = "no deadline known" if budget_s is None else f"{estimate:.1f}s estimated fits {budget_s:.1f}s left"
            return _with(plan, estimate, why)
    return EmergencyPlan(False, False, False, False, budget_s, inflight_s,
                         f"not even the weights fit: {inflight_s + MARGIN * weights_bytes / write_bytes_per_s:.1f}s "
                         f"estimated, {budget_s:.1f}s left; the newest checkpoint stays")


def _with(plan: EmergencyPlan, estimate_s: float, reason: str) -> EmergencyPlan:
    return EmergencyPlan(plan.save, plan.optimizer, plan.check, plan.cold_copy, plan.budget_s, round(estimate_s, 3),
                         reason)
