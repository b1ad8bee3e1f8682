"""What a Slurm job does when an attempt ends: finish, requeue itself, leave it to Slurm, or give up.
Pure: inputs are how the attempt ended and the run's ledger; the output is an action with a reason.

- Time-limit warning or preemption notice (the job's warning signal): requeue; never uses the budget.
- SIGTERM: Slurm itself is ending the job. A `scontrol requeue` or a preemption puts it back in the
  queue; a user's `scancel` does not. The job must not second-guess that, so it just exits.
- A failure: requeue while the failures without progress stay within the restart budget; a new
  checkpoint in between is progress and resets the count. Then give up, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WARNING_SIGNALS = ("SIGUSR1", "SIGUSR2")
FINISH, REQUEUE, EXIT, GIVE_UP = "finish", "requeue", "exit", "give_up"


@dataclass(frozen=True)
class Decision:
    action: str
    """finish | requeue | exit (leave it to Slurm) | give_up"""
    reason: str


def attempt_key(event: dict[str, Any]) -> tuple[str, int] | None:
    if event.get("job_id") is None:
        return None
    return str(event["job_id"]), int(event.get("restart") or 0)


def failures_without_progress(history: list[dict[str, Any]]) -> int:
    """Consecutive failed attempts, newest first, that committed no checkpoint beyond the best
    one before them. Attempts that ended cleanly (preempted, timed out) neither count nor reset."""
    attempts: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in history:
        key = attempt_key(e)
        if key is not None:
            attempts.setdefault(key, []).append(e)
    ordered = list(attempts.values())
    best_before = []
    best = -1
    for events in ordered:
        best_before.append(best)
        best = max([best] + [e["step"] for e in events if e["event"] == "save"])
    count = 0
    for events, before in zip(reversed(ordered), reversed(best_before)):
        saved = max([-1] + [e["step"] for e in events if e["event"] == "save"])
        if saved > before:
            break
        if any(e["event"] == "crash" for e in events):
            count += 1
    return count


def decide(code: int, signal: str | None, error: str | None, history: list[dict[str, Any]], max_restarts: int) -> Decision:
    """`code` is the attempt's ExitCode (0 done, 75 stopped on request, else failed)."""
    if code == 0:
        return Decision(FINISH, "training finished")
    if code == 75:
        if signal in WARNING_SIGNALS:
            return Decision(REQUEUE, f"{signal}: time-limit warning or preemption notice; saved and requeued")
        return Decision(EXIT, f"{signal or 'stop request'}: Slurm requeues a requeued or preempted job itself; "
                              f"a cancelled one stays cancelled")
    failures = failures_without_progress(history)
    error = _short(error)
    if failures == 0:
        return Decision(REQUEUE, f"failed after saving progress; requeued, restart budget untouched: {error}")
    if failures <= max_restarts:
        return Decision(REQUEUE, f"failure {failures} without progress (budget {max_restarts} restarts): {error}")
    return Decision(GIVE_UP, f"{failures} consecutive failures without progress exceed the restart budget "
                             f"of {max_restarts}; last: {error}")


def _short(error: str | None, limit: int = 300) -> str:
    first = (error or "unknown error").strip().splitlines()[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def restart_cause(history: list[dict[str, Any]], current: tuple[str, int]) -> str:
    """Why attempt `current` runs: how the attempt before it ended, from the ledger."""
    previous = [e for e in history if (k := attempt_key(e)) is not None and k != current]
    if not previous:
        return "first start"
    last_key = attempt_key(previous[-1])
    last = [e for e in previous if attempt_key(e) == last_key]
    for e in reversed(last):
        if e["event"] in ("requeue", "gave_up"):
            return e["reason"]
        if e["event"] == "stop":
            signals = [s["signal"] for s in last if s["event"] == "signal"]
            return f"stopped by {signals[0] if signals else 'a stop request'} at step {e['step']}"
        if e["event"] == "crash":
            return f"crashed at step {e['step']}: {e.get('error')}"
    return "the previous attempt ended without a trace (killed, or its node failed)"
