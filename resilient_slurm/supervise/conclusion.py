"""What the driver concludes when a start of training has ended: one typed outcome. Pure.

The driver gathers the facts (`Ended`: how the step ended as `step_end.judge` read it, the run's
ledger with the failures just recorded, the allocation, the stop Slurm asked for, the move the
driver itself stopped the step for) and `conclude` turns them into exactly one of:

    Finished      training is done: the driver returns its result
    RestartHere   a new start inside the allocation (in place, on a spare, shrunk, grown, swapped)
    Requeue       only a new allocation helps: requeue the job, without the nodes that failed
    LeaveToSlurm  Slurm is ending the job (scancel, scontrol requeue, preemption): exit, it decides
    GiveUp        a restart cannot help: stop for good

The driver's `act` is the one place that acts on them (every exit of the driver is there). The
decision itself is `recovery.decide`, the code every restart uses; placement is
`slurm.placement`. `PendingRestart` is what a restart inside the allocation records once its new
start took its first step (`restarts.record_restart`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import recovery
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import FAILURES, Event, NodeUnhealthy
from resilient_slurm.slurm import placement
from resilient_slurm.slurm.placement import Allocation, Placement
from resilient_slurm.slurm.step_end import StepEnd


@dataclass(frozen=True, kw_only=True)
class PendingRestart:
    """A restart inside the allocation, recorded (under the new start's attempt key) once the new
    start takes its first step."""

    cause: str
    placement: str
    move: str
    """placement.Move's value: in place, spare, shrink, grow, swap."""
    replaced: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    failed_at: float
    """When the failure was first known (or the driver asked the step to stop for its own move)."""
    last_step: int | None
    path: str = "step"
    """inprocess or step."""
    why: str = ""
    """Why the path (a refused restart inside the processes)."""
    decided_at: float = 0.0
    placed_at: float = 0.0
    """When the new start's processes were launched (or told to rejoin)."""
    ended_at: float = 0.0
    """When the failed start's processes were gone (a step restart)."""
    replacements: tuple[int, ...] = ()
    """Ranks whose processes are new (a restart inside the processes); empty: all."""
    nodes: tuple[str, ...] = ()
    """The nodes the new start runs on."""


@dataclass(frozen=True)
class Finished:
    reason: str


@dataclass(frozen=True)
class RestartHere:
    allocation: Allocation
    restart: PendingRestart
    take_out: tuple[str, ...] = ()
    """Nodes the failures follow (the crash-loop guard): excluded and drained before the restart."""
    reason: str = ""


@dataclass(frozen=True)
class Requeue:
    decision: recovery.Decision
    last_step: int | None
    take_out: tuple[str, ...] = ()
    """As RestartHere's: drained before the requeue (the requeue excludes them too)."""


@dataclass(frozen=True)
class LeaveToSlurm:
    reason: str


@dataclass(frozen=True)
class GiveUp:
    reason: str
    last_step: int | None


Conclusion = Finished | RestartHere | Requeue | LeaveToSlurm | GiveUp


@dataclass(frozen=True)
class DriverMove:
    """A move the driver stopped a healthy step for (grow back, swap a straggler): the step saves
    and exits with `signal`, then restarts on `placement`."""

    placement: Placement
    cause: str
    signal: str
    since: float
    """When its reason arose (a straggler found; for a grow, when the driver asked)."""
    asked_at: float
    """When the driver signalled the step to stop."""


@dataclass(frozen=True)
class Ended:
    """What the driver knows once every srun of a start has exited."""

    end: StepEnd | None
    """How the step ended; None: srun could not start it (no step id, no trace)."""
    ours: tuple[Event[Any], ...]
    """The step's own ledger events (its attempt key)."""
    history: tuple[Event[Any], ...]
    """The run's whole ledger, with the failures the driver just recorded for the step."""
    allocation: Allocation
    nodes: tuple[str, ...]
    """The nodes the step ran on."""
    srun_code: int | None
    stop_requested: bool
    max_restarts: int
    ended_at: float
    """When the driver saw the last srun exit."""
    report_times: tuple[float, ...] = ()
    """When srun's reports of the failure's origin came."""
    lost_nodes: tuple[str, ...] = ()
    """Nodes whose tasks vanished, found while judging a restart inside the processes."""
    move: DriverMove | None = None
    decided_at: float = 0.0
    """When the driver decided to end the step (0: it ended by itself)."""
    killed_at: float = 0.0
    """When the step's processes were gone after the driver ended it."""
    refused: str = ""
    """Why the survivors did not restart in their processes."""
    last_step: int | None = field(default=None)


def conclude(x: Ended) -> Conclusion:
    """The one outcome of a start that ended; see the module's table."""
    if x.end is None:
        if x.stop_requested:
            return LeaveToSlurm("stop requested before srun started the step")
        # srun retries a step the nodes cannot take yet itself; one it gave up on means the
        # allocation cannot run it: only a new one can.
        reason = f"srun could not start a step on {','.join(x.nodes)} (exit {x.srun_code})"
        return Requeue(recovery.Decision(recovery.Action.REQUEUE, reason), None)
    end, move = x.end, x.move
    if move is not None and end.code == ExitCode.RESUME and end.signal == f"SIG{move.signal}" \
            and not end.unhealthy and not x.stop_requested:
        p = move.placement
        replaced = tuple(n for n in x.allocation.in_use if n not in p.allocation.in_use)
        return RestartHere(p.allocation, PendingRestart(
            cause=move.cause, placement=p.reason, move=p.move.value, replaced=replaced, added=p.added,
            failed_at=move.since, last_step=x.last_step, decided_at=move.asked_at, ended_at=x.killed_at,
            nodes=p.allocation.in_use), reason=p.reason)
    decision = recovery.decide(end.code, end.signal, end.error, list(x.history), x.max_restarts)
    if decision.action is recovery.Action.FINISH:
        return Finished(f"finished at step {x.last_step}")
    if decision.action is recovery.Action.GIVE_UP:
        return GiveUp(decision.reason, x.last_step)
    if x.stop_requested or decision.action is recovery.Action.EXIT:
        # Slurm is ending the job (scancel, scontrol requeue, preemption): it decides what next.
        return LeaveToSlurm(decision.reason)
    if end.code == ExitCode.RESUME and end.signal in recovery.WARNING_SIGNALS:
        # The allocation itself is ending (time limit, preemption notice): only the queue helps.
        return Requeue(decision, x.last_step)
    alloc = x.allocation
    held = set(alloc.in_use) | set(alloc.spares)
    failed = [n for n in dict.fromkeys([*end.unhealthy, *(u.node for u in end.lost), *x.lost_nodes,
                                         *decision.exclude_nodes]) if n in held]
    take_out = tuple(n for n in decision.exclude_nodes if n in held and n not in end.unhealthy)
    placed = placement.after_failure(alloc, failed)
    if placed.move is placement.Move.REQUEUE:
        exclude = tuple(sorted(set(placed.exclude) | set(decision.exclude_nodes)))
        return Requeue(recovery.Decision(recovery.Action.REQUEUE, f"{decision.reason}; {placed.reason}",
                                         exclude_nodes=exclude), x.last_step, take_out)
    traces = [stamp_seconds(e.time) for e in x.ours if e.kind in FAILURES or isinstance(e.details, NodeUnhealthy)]
    failed_at = min([x.ended_at, *x.report_times, *traces])
    return RestartHere(placed.allocation, PendingRestart(
        cause=decision.reason, placement=placed.reason, move=placed.move.value, replaced=tuple(failed),
        added=placed.added, failed_at=failed_at, last_step=x.last_step, why=x.refused,
        decided_at=x.decided_at or x.ended_at, ended_at=x.killed_at, nodes=placed.allocation.in_use),
        take_out=take_out, reason=placed.reason)
