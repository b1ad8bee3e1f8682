"""What to do about what went wrong. Pure: inputs are the event, the run's ledger and the budgets;
the output is an action with a reason.

When an attempt of a Slurm job ends (`decide`):
- Time-limit warning or preemption notice (the job's warning signal): requeue; never uses the budget.
- SIGTERM: Slurm itself is ending the job. A `scontrol requeue` or a preemption puts it back in the
  queue; a user's `scancel` does not. The job must not second-guess that, so it just exits.
- A failure (crash, hang, dead rank): requeue while the failures without progress stay within the
  restart budget; a new checkpoint in between is progress and resets the count. The same failure
  at the same step on different nodes is a code bug: stop and say so. Failures that follow one
  node across steps are hardware: requeue excluding that node. Out of budget: give up.

When the monitor finds an anomaly during training (`on_findings`): roll back to the checkpoint
before it and skip its data (at most `max_rollbacks` times), or just report it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

WARNING_SIGNALS = ("SIGUSR1", "SIGUSR2")
FINISH, REQUEUE, EXIT, GIVE_UP, ROLLBACK, REPORT = "finish", "requeue", "exit", "give_up", "rollback", "report"
FAILURE_EVENTS = ("crash", "hang")
# A rank that fails because a peer died or hung reports the collective, not the cause.
_PEER_FAILURE = re.compile(r"connection closed by peer|connection reset|timed out|timeout|remote worker|"
                           r"nccl|gloo|broken pipe|^hang:", re.IGNORECASE)


@dataclass(frozen=True)
class Decision:
    action: str
    """finish | requeue | exit (leave it to Slurm) | give_up | rollback | report"""
    reason: str
    exclude_nodes: tuple[str, ...] = ()
    """Requeue without these nodes: they failed a health check, or the failures follow them."""


@dataclass(frozen=True)
class Failure:
    step: int | None
    error: str
    node: str | None

    @property
    def origin(self) -> bool:
        """Not merely a rank that lost its peer."""
        return not _PEER_FAILURE.search(self.error)


def attempt_key(event: dict[str, Any]) -> tuple[str, int] | None:
    if event.get("job_id") is None:
        return None
    return str(event["job_id"]), int(event.get("restart") or 0)


def failure_streak(history: list[dict[str, Any]]) -> list[list[Failure]]:
    """The failures of consecutive failed attempts, newest first, that committed no checkpoint
    beyond the best one before them. Attempts that ended cleanly (preempted, timed out) neither
    count nor break the streak."""
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
    streak: list[list[Failure]] = []
    for events, before in zip(reversed(ordered), reversed(best_before)):
        saved = max([-1] + [e["step"] for e in events if e["event"] == "save"])
        if saved > before:
            break
        failures = [Failure(e.get("step"), _failure_text(e), e.get("node")) for e in events
                    if e["event"] in FAILURE_EVENTS]
        if failures:
            streak.append(failures)
    return streak


def failures_without_progress(history: list[dict[str, Any]]) -> int:
    return len(failure_streak(history))


def classify(streak: list[list[Failure]]) -> tuple[str, str, str | None] | None:
    """(kind, explanation, node) for a streak of two or more failed attempts: a code bug (the same
    failure at the same step on every attempt) or a node (its failures follow it), else None."""
    if len(streak) < 2:
        return None
    origins = [[f for f in attempt if f.origin] or attempt for attempt in streak]
    signatures = {(_short(f.error, 120), f.step) for attempt in origins for f in attempt}
    nodes = sorted({f.node for attempt in origins for f in attempt if f.node})
    if len(signatures) == 1:
        error, step = next(iter(signatures))
        where = f" on nodes {', '.join(nodes)}" if len(nodes) > 1 else f" on node {nodes[0]}" if nodes else ""
        return "code_bug", f"code bug: the same failure after step {step} on every attempt{where}: {error}", None
    common = set.intersection(*({f.node for f in attempt if f.node} for attempt in origins))
    if len(common) == 1:
        node = common.pop()
        steps = sorted({f.step for attempt in origins for f in attempt if f.step is not None})
        return "node", f"failures follow node {node} across steps {steps}: hardware, not code", node
    return None


def decide(code: int, signal: str | None, error: str | None, history: list[dict[str, Any]], max_restarts: int) -> Decision:
    """`code` is the attempt's ExitCode (0 done, 75 stopped on request, 70 gave up, else failed);
    `history` includes this attempt's own failure events."""
    if code == 0:
        return Decision(FINISH, "training finished")
    unhealthy = unhealthy_nodes(history)
    if unhealthy:
        # The node's fault, not the job's: no restart budget is used.
        why = "; ".join(f"{node}: {reason}" for node, reason in unhealthy.items())
        return Decision(REQUEUE, f"failed node health check ({why}); requeued without it",
                        exclude_nodes=tuple(unhealthy))
    if code == 75:
        if signal in WARNING_SIGNALS:
            return Decision(REQUEUE, f"{signal}: time-limit warning or preemption notice; saved and requeued")
        return Decision(EXIT, f"{signal or 'stop request'}: Slurm requeues a requeued or preempted job itself; "
                              f"a cancelled one stays cancelled")
    if code == 70:
        return Decision(GIVE_UP, _short(error))
    streak = failure_streak(history)
    failures = len(streak)
    error = _short(error)
    if failures == 0:
        return Decision(REQUEUE, f"failed after saving progress; requeued, restart budget untouched: {error}")
    kind = classify(streak)
    if kind and kind[0] == "code_bug" and len({f.node for a in streak for f in a if f.node}) > 1:
        return Decision(GIVE_UP, f"{kind[1]}; a restart will not fix it")
    if failures > max_restarts:
        why = f"; {kind[1]}" if kind else ""
        return Decision(GIVE_UP, f"{failures} consecutive failures without progress exceed the restart budget "
                                 f"of {max_restarts}{why}; last: {error}")
    if kind and kind[0] == "node":
        return Decision(REQUEUE, f"failure {failures} without progress (budget {max_restarts}); {kind[1]}: "
                                 f"requeued without it", exclude_nodes=(kind[2],) if kind[2] else ())
    return Decision(REQUEUE, f"failure {failures} without progress (budget {max_restarts} restarts): {error}")


def unhealthy_nodes(history: list[dict[str, Any]]) -> dict[str, str]:
    """Nodes the latest attempt found unhealthy (`node_unhealthy` events), with the reasons."""
    keys = [k for e in history if (k := attempt_key(e)) is not None]
    if not keys:
        return {}
    return {e["bad_node"]: e["reason"] for e in history
            if e["event"] == "node_unhealthy" and attempt_key(e) == keys[-1]}


def on_findings(kinds: Iterable[str], rollback_on: Iterable[str], rollbacks_done: int, max_rollbacks: int) -> Decision:
    """After a step: roll back for an acting finding while the rollback budget lasts, else report."""
    acting = sorted(set(kinds) & set(rollback_on))
    if not acting:
        return Decision(REPORT, "reported; no action configured")
    if rollbacks_done < max_rollbacks:
        return Decision(ROLLBACK, f"{', '.join(acting)}: rollback {rollbacks_done + 1} of {max_rollbacks}")
    return Decision(GIVE_UP, f"{', '.join(acting)} again after {rollbacks_done} rollbacks (monitor.max_rollbacks="
                             f"{max_rollbacks}): the run keeps diverging; stopping, do not requeue")


def _failure_text(e: dict[str, Any]) -> str:
    return f"hang: {e.get('reason')}" if e["event"] == "hang" else str(e.get("error"))


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
    # The job's own decision explains best; then a stop; then the failure (ranks may log after it).
    for kinds in (("requeue", "gave_up"), ("stop",), FAILURE_EVENTS):
        found = [e for e in last if e["event"] in kinds]
        if not found:
            continue
        e = found[-1]
        if e["event"] == "stop":
            signals = [s["signal"] for s in last if s["event"] == "signal"]
            return f"stopped by {signals[0] if signals else 'a stop request'} at step {e['step']}"
        if e["event"] in FAILURE_EVENTS:
            return f"{'hung' if e['event'] == 'hang' else 'crashed'} at step {e['step']}: {_short(_failure_text(e))}"
        return e["reason"]
    return "the previous attempt ended without a trace (killed, or its node failed)"
