"""A restart inside the surviving processes, the driver's side (`cluster.restart_in_process`): after a
rank's process died, its replacement is started (a standby woken on a spare, or a new one-task
step; on a spare when its node is lost, else in place), and the survivors are told where the next
generation meets (`session/rejoin.py`). Refused, with the reason, when they cannot go on: a
CUDA-class error, no survivor, another world size, a decision that is not a restart; the driver
then ends the start and every process restarts.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from resilient_slurm import recovery
from resilient_slurm.ledger import FAILURES, Attempt, Crash, read_events
from resilient_slurm.rundir import RunDir
from resilient_slurm.session import rejoin
from resilient_slurm.slurm import placement, scontrol
from resilient_slurm.slurm.env import master_port
from resilient_slurm.slurm.placement import Allocation
from resilient_slurm.slurm.step_end import Untraced, judge, task_rank
from resilient_slurm.supervise.conclusion import PendingRestart
from resilient_slurm.supervise.job import DriverJob, say
from resilient_slurm.supervise.standby import Standbys
from resilient_slurm.supervise.steps import Generation

if TYPE_CHECKING:
    from resilient_slurm.supervise.heartbeat import HeartbeatMonitor

SETTLE_S = 1.0
"""After a rank's death, how long the driver lets its trace and its peers' reach the ledger."""


def restart_in_processes(job: DriverJob, gen: Generation, alloc: Allocation, standbys: Standbys,
                         monitor: HeartbeatMonitor | None, decided_at: float
                         ) -> tuple[Allocation, PendingRestart] | str:
    """The next generation started (the new allocation and the restart to record), or why not."""
    c = job.cfg.cluster
    time.sleep(SETTLE_S)  # the failed ranks' own traces and the survivors' peer_lost reach the ledger
    key = (job.job_id, job.restart, gen.step_id)
    ours = [e for e in read_events(RunDir(job.path).events) if recovery.attempt_key(e) == key]
    origin = gen.origin_reports
    end = judge(ours, origin, alloc.in_use, c.tasks_per_node)
    last_step = max([e.step for e in ours if isinstance(e.step, int)], default=None)
    record_untraced(job, gen.step_id, end.untraced, alloc.in_use, last_step)
    # Recorded now, these tasks have a trace: the step's end, if it comes to that, must still
    # count their nodes as lost.
    gen.lost.extend(x.node for x in end.lost)
    world = len(alloc.in_use) * c.tasks_per_node
    lost_nodes = {x.node for x in end.lost if x.rank is None}
    failed = sorted({rank_of(x, alloc.in_use, c.tasks_per_node) for x in end.untraced if x.rank is not None}
                    | {e.rank for e in ours if e.kind in FAILURES and e.rank >= 0}
                    | {r for r in range(world) if alloc.in_use[r // c.tasks_per_node] in lost_nodes})
    gone = [*end.unhealthy, *(x.node for x in end.lost)]
    placed = placement.after_failure(alloc, gone)
    errors = [e.details.error for e in ours if isinstance(e.details, Crash) and e.rank in failed]
    same_size = placed.move in (placement.Move.IN_PLACE, placement.Move.SPARE) and \
        len(placed.allocation.in_use) == len(alloc.in_use)
    refused = recovery.inprocess_refusal(False, errors, world - len(failed), same_size)
    decision = recovery.decide(end.code, end.signal, end.error, read_events(RunDir(job.path).events), c.max_restarts)
    if refused:
        return refused
    if decision.action is not recovery.Action.REQUEUE:
        return f"the decision is {decision.action.value}: {decision.reason}"
    new = placement.keep_positions(alloc.in_use, placed.allocation, gone)
    replaced: dict[int, int] = {}
    for rank in failed:
        node = new.in_use[rank // c.tasks_per_node]
        s = standbys.take(node)
        if s is not None and s.step_id is not None:  # take() hands out named ones only
            gen.adopt(s)
            rejoin.wake(job.path, job.job_id, job.restart, s.step_id, gen.number + 1)
        else:
            s = gen.start(job.argv((node,), 1, replace(job.launch, join=gen.number + 1), overlap=node in alloc.in_use),
                          (node,))
        if not s.named.wait(SETTLE_S * 30) or s.step_id is None:
            return f"srun did not start the replacement of rank {rank} on {node}"
        replaced[s.step_id] = rank
    failed_at = min([*gen.report_times[: len(origin)], decided_at])
    step_id = min(replaced)
    master = scontrol.node_address(new.in_use[0])
    rejoin.write_instruction(job.path, job.job_id, job.restart, rejoin.Instruction(
        gen.number + 1, step_id, master, master_port(job.job_id, step_id), world, replaced, c.tasks_per_node,
        decided_at))
    placed_at = time.time()
    history = read_events(RunDir(job.path).events)
    job.log(step_id).emit(Attempt(nodes=list(new.in_use), ntasks=world, cause=recovery.restart_cause(
        history, (job.job_id, job.restart, step_id))), None)
    if monitor is not None:
        monitor.restart(gen.number + 1, world)
    gen.next(step_id)
    move = placement.Move.SPARE if placed.added else placement.Move.IN_PLACE
    say(f"restarting inside the surviving processes ({move.value}): ranks {failed} start anew; {placed.reason}")
    return new, PendingRestart(cause=decision.reason, placement=placed.reason, move=move.value,
                               replaced=tuple(dict.fromkeys(gone)), added=placed.added, failed_at=failed_at,
                               last_step=last_step, path="inprocess", decided_at=decided_at, placed_at=placed_at,
                               replacements=tuple(failed), nodes=new.in_use)


def record_untraced(job: DriverJob, step_id: int | None, untraced: tuple[Untraced, ...], nodes: tuple[str, ...],
                    last_step: int | None) -> None:
    """A failure no task recorded itself (a lost task, one that exited before its first trace),
    recorded for it under its own rank and node, so the budget and the crash-loop guard count it."""
    for task in untraced:
        job.log(step_id, rank_of(task, nodes, job.cfg.cluster.tasks_per_node), task.node).emit(
            Crash(error=task.error, traceback=""), last_step)


def rank_of(task: Untraced, nodes: tuple[str, ...], tasks_per_node: int) -> int:
    """The global rank of a task srun reported (`task_rank`); -1 for none (its node failed)."""
    return -1 if task.rank is None else task_rank(task.node, task.rank, nodes, tasks_per_node)
