"""How a driven job step ended, from what its tasks wrote to the ledger and what srun reported. Pure.

The tasks of a step run by the driver record their outcome (finish, stop, crash, hang, a failed
health check) and decide nothing. The driver reads it back as the (exit code, stop signal, error)
that `recovery.decide` takes, as if one process had ended. A task that srun saw end by a signal
(SIGKILL, the OOM killer, a segfault) or with its node, and that recorded no failure of its own,
left no trace: it is **lost**, and its node is treated as failed for the rest of the allocation,
because a process that vanishes is what a dying node looks like from the outside. The driver
records every failure no task recorded itself (a lost task; one that exited before its first
trace), so that the restart budget and the crash-loop guard count it like any other.
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
class Untraced:
    """A task srun saw end badly that recorded nothing about it."""

    node: str
    rank: int | None
    """None: srun reported the node failed, with every task on it."""
    status: str

    @property
    def lost(self) -> bool:
        """Ended by a signal or with its node: a process that vanished."""
        return not self.status.startswith("Exited with exit code")

    @property
    def error(self) -> str:
        who = f"task {self.rank}" if self.rank is not None else "every task"
        # Spelled like exceptions, so reports class them with the crashes: `crashed (TaskLost)`.
        if self.lost:
            return f"TaskLost: {who} on {self.node} ended without a trace ({self.status}): its process was killed " \
                   f"or its node failed"
        return f"TaskFailed: {who} on {self.node} ended before it wrote a trace ({self.status})"


@dataclass(frozen=True)
class StepEnd:
    code: ExitCode
    signal: str | None = None
    """The stop signal every rank saved and stopped for (SIGUSR1, ...)."""
    error: str | None = None
    untraced: tuple[Untraced, ...] = ()
    """Origin tasks that left no trace: the driver records their failure for them."""
    unhealthy: tuple[str, ...] = ()
    """Nodes whose health check failed during the step."""

    @property
    def lost(self) -> tuple[Untraced, ...]:
        return tuple(u for u in self.untraced if u.lost)


def judge(events: Sequence[Event[Any]], reports: Sequence[TaskReport], nodes: Sequence[str] = (),
          tasks_per_node: int = 1) -> StepEnd:
    """`events`: the step's own ledger events (its attempt key); `reports`: srun's task reports from
    before the driver acted on them (the origin of a failure, not its consequences); `nodes`,
    `tasks_per_node`: the start's placement, by which a report's task is a rank (`task_rank`)."""
    kinds = {e.kind for e in events}
    traced = {e.rank for e in events if e.kind in FAILURES or e.kind is Kind.NODE_UNHEALTHY}
    untraced = tuple(Untraced(r.node, t, r.status) for r in reports for t in (r.tasks or (None,))
                     if t is None or task_rank(r.node, t, nodes, tasks_per_node) not in traced)
    lost = [u for u in untraced if u.lost]
    unhealthy = tuple(dict.fromkeys(e.details.bad_node for e in select(list(events), NodeUnhealthy)))
    if Kind.FINISH in kinds:
        return StepEnd(ExitCode.DONE, unhealthy=unhealthy)
    if gave_up := select(list(events), GaveUp):
        return StepEnd(ExitCode.GAVE_UP, error=gave_up[-1].details.reason, unhealthy=unhealthy)
    if lost:
        return StepEnd(ExitCode.FAILED, error=lost[0].error, untraced=untraced, unhealthy=unhealthy)
    if Kind.STOP in kinds or Kind.PAUSED in kinds:
        signals = [e.details.signal for e in select(list(events), Signal)]
        return StepEnd(ExitCode.RESUME, signal=signals[0] if signals else None, unhealthy=unhealthy)
    failures = [Failure(e.step, _text(e), e.node) for e in events if e.kind in FAILURES]
    if failures:
        origin = next((f for f in failures if f.origin), failures[0])
        return StepEnd(ExitCode.FAILED, error=origin.error, untraced=untraced, unhealthy=unhealthy)
    if unhealthy:
        # Refused by the health check before training: the node's fault, not the job's.
        return StepEnd(ExitCode.RESUME, unhealthy=unhealthy)
    if untraced:
        return StepEnd(ExitCode.FAILED, error=untraced[0].error, untraced=untraced)
    return StepEnd(ExitCode.FAILED, error="TaskFailed: the step ended before any task wrote a trace")


def task_rank(node: str, task: int, nodes: Sequence[str], tasks_per_node: int) -> int:
    """The global rank of task `task` srun reported on `node`: its position on its node in the
    start's node list. A replacement step's tasks count from 0 on their node, as the first step's
    count from 0 on the first node: task 0 of the step that replaced rank 3 is rank 3."""
    if node in nodes:
        return list(nodes).index(node) * tasks_per_node + task % tasks_per_node
    return task


def _text(e: Event[Any]) -> str:
    if isinstance(e.details, Hang):
        return HANG_PREFIX + e.details.reason
    return e.details.error if isinstance(e.details, Crash) else "unknown failure"
