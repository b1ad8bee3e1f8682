"""How a driven job step ended, from what its tasks wrote to the ledger and what srun reported. Pure.

The tasks of a step run by the driver record their outcome (finish, stop, crash, hang, a failed
health check) and decide nothing. The driver reads it back as the (exit code, stop signal, error)
that `recovery.decide` takes, as if one process had ended. A task that srun saw end by a signal
(SIGKILL, the OOM killer, a segfault) or with its node, and that recorded no failure of its own,
left no trace: it is **lost**, and its node is treated as failed for the rest of the allocation,
because a process that vanishes is what a dying node looks like from the outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import FAILURES, Crash, Event, GaveUp, Hang, Kind, NodeUnhealthy, Signal, select
from resilient_slurm.recovery import HANG_PREFIX, Failure
from resilient_slurm.slurm.srun import TaskReport


@dataclass(frozen=True)
class Lost:
    """A task that ended without a trace."""

    node: str
    rank: int | None
    """None: srun reported the node failed, with every task on it."""
    status: str

    @property
    def error(self) -> str:
        who = f"task {self.rank}" if self.rank is not None else "every task"
        # Spelled like an exception, so reports class it with the crashes: `crashed (TaskLost)`.
        return f"TaskLost: {who} on {self.node} ended without a trace ({self.status}): its process was killed or " \
               f"its node failed"


@dataclass(frozen=True)
class StepEnd:
    code: ExitCode
    signal: str | None = None
    """The stop signal every rank saved and stopped for (SIGUSR1, ...)."""
    error: str | None = None
    lost: tuple[Lost, ...] = ()
    unhealthy: tuple[str, ...] = ()
    """Nodes whose health check failed during the step."""


def judge(events: Sequence[Event[Any]], reports: Sequence[TaskReport], launched: bool = True) -> StepEnd:
    """`events`: the step's own ledger events (its attempt key); `reports`: srun's task reports from
    before the driver acted on them (the origin of a failure, not its consequences); `launched`:
    srun created the step (else its error is the report)."""
    kinds = {e.kind for e in events}
    traced = {e.rank for e in events if e.kind in FAILURES}
    lost = tuple(Lost(r.node, t, r.status) for r in reports if not r.exited for t in (r.tasks or (None,))
                 if t not in traced)
    unhealthy = tuple(dict.fromkeys(e.details.bad_node for e in select(list(events), NodeUnhealthy)))
    if Kind.FINISH in kinds:
        return StepEnd(ExitCode.DONE, unhealthy=unhealthy)
    if gave_up := select(list(events), GaveUp):
        return StepEnd(ExitCode.GAVE_UP, error=gave_up[-1].details.reason, unhealthy=unhealthy)
    if lost:
        return StepEnd(ExitCode.FAILED, error=lost[0].error, lost=lost, unhealthy=unhealthy)
    if Kind.STOP in kinds or Kind.PAUSED in kinds:
        signals = [e.details.signal for e in select(list(events), Signal)]
        return StepEnd(ExitCode.RESUME, signal=signals[0] if signals else None, unhealthy=unhealthy)
    failures = [Failure(e.step, _text(e), e.node) for e in events if e.kind in FAILURES]
    if failures:
        origin = next((f for f in failures if f.origin), failures[0])
        return StepEnd(ExitCode.FAILED, error=origin.error, unhealthy=unhealthy)
    if unhealthy:
        # Refused by the health check before training: the node's fault, not the job's.
        return StepEnd(ExitCode.RESUME, unhealthy=unhealthy)
    if reports:
        first = reports[0]
        return StepEnd(ExitCode.FAILED, error=f"task(s) {list(first.tasks)} on {first.node}: {first.status}")
    why = "the step ended before any task wrote a trace" if launched else "srun could not start the step"
    return StepEnd(ExitCode.FAILED, error=why)


def _text(e: Event[Any]) -> str:
    if isinstance(e.details, Hang):
        return HANG_PREFIX + e.details.reason
    return e.details.error if isinstance(e.details, Crash) else "unknown failure"
