"""The job's driver with replica groups (cluster.replica_ft): each group a job step of its own, on
its own nodes, so that a failure ends only its group's step.

The groups meet at a lighthouse the driver runs (`replica/lighthouse.py`) and train on; the driver
watches each group's step. When a task of group g ends badly (srun reports it) or a rank of g goes
silent (its heartbeats: its stacks and a `hang` are recorded), the rest of g is killed, and g is
started anew: on the same nodes, except a node whose task vanished (killed, or its node died),
which a spare takes (`placement.replace_group`); on a spare, the process that stood by there since
the start (cluster.standby) is woken into the group, else a new one-task step starts. Each of the
replacement's ranks reads where its group now meets from the driver's word (`rejoin.Instruction`
with the group), takes the state from a live group over the network at its first quorum, and
joins; the other groups never stopped. No spare for a lost node: the group stays out, and the
others go on without it.

Refused (`replica.plan.refusal`: every group lost at once, no live group, fewer than
cluster.replica_min, or a replacement that failed before it joined; one line in the ledger,
`replica_refused`): every step is killed and the run starts again from the newest checkpoint, as a
driver restarts after any failure (the restart budget and the crash-loop guard of
`recovery.decide`), on spares for the lost nodes, or, without enough nodes, through the queue.

When every group's step has ended in order (finished, stopped by a signal, gave up), the run ends as
it would without groups: finished, requeued after the time-limit warning, or left to Slurm.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilient_slurm import recovery
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import (
    Crash,
    Finish,
    GaveUp,
    ReplicaJoin,
    ReplicaRefused,
    Signal,
    Stop,
    read_events,
    read_new_events,
    select,
)
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.replica import plan
from resilient_slurm.replica.engine import LIGHTHOUSE_ENV
from resilient_slurm.replica.lighthouse import Lighthouse
from resilient_slurm.rundir import RunDir
from resilient_slurm.session import rejoin
from resilient_slurm.slurm import placement, scontrol
from resilient_slurm.slurm.env import master_port
from resilient_slurm.slurm.placement import Allocation
from resilient_slurm.supervise.hangs import record_hang
from resilient_slurm.supervise.steps import Generation
from resilient_slurm.supervise.task import GaveUp as GaveUpError
from resilient_slurm.supervise.task import requeue

if TYPE_CHECKING:
    from resilient_slurm.supervise.driver import SlurmDriver

POLL_S = 0.05
AT_ONCE_S = 1.0
"""Groups that fail within this of each other failed at once (one cause)."""
NAMED_S = 30.0
"""How long srun may take to name a step it started."""


@dataclass
class Group:
    index: int
    nodes: tuple[str, ...]
    gen: Generation
    joining: bool = False
    """Its processes replace a lost group and have not joined the others yet."""
    out: bool = False
    """Lost with no spare for its node: the run goes on without it."""

    @property
    def failed(self) -> bool:
        """A task ended badly: srun said so, or a step exited non-zero."""
        return bool(self.gen.reports) or any(s.proc.poll() not in (None, 0) for s in self.gen.sruns)


@dataclass
class Ending:
    """How a start of every group ended."""

    refused: str = ""
    lost: tuple[str, ...] = ()
    last_step: int | None = None
    groups: list[int] = field(default_factory=list)


class ReplicaDriver:
    def __init__(self, driver: SlurmDriver) -> None:
        self.d = driver
        self.cfg = driver.cfg
        c = self.cfg.cluster
        self.groups_n = self.cfg.parallel.dp_replicate
        self.per_node = c.tasks_per_node
        self.replaced = 0
        """Replacements started: each has its own instruction file (its `generation` in the name)."""

    def run(self, alloc: Allocation) -> str:
        c = self.cfg.cluster
        lighthouse = Lighthouse(c.replica_min, c.replica_timeout_s)
        os.environ[LIGHTHOUSE_ENV] = lighthouse.address  # every step the driver starts inherits it
        try:
            while True:
                if self.d.stop.requested:
                    sys.exit(int(ExitCode.RESUME))
                began = time.time()
                ending = self._start(alloc)
                self.d.standbys.dismiss(self.d.job_id)
                if not ending.refused:
                    return self._conclude(began)
                alloc = self._restart_all(alloc, ending)
        finally:
            lighthouse.close()

    # --- one start of every group
    def _start(self, alloc: Allocation) -> Ending:
        per_group = len(alloc.in_use) // self.groups_n
        self.alloc = alloc
        d = self.d
        groups = [Group(g, alloc.in_use[g * per_group:(g + 1) * per_group], Generation([]))
                  for g in range(self.groups_n)]
        for g in groups:
            g.gen.start(self._argv(g.nodes, self.per_node, g.index, heal=False), g.nodes)
        if d.monitor is not None:
            d.monitor.restart(0)
        if self.cfg.cluster.standby and alloc.spares:
            groups[-1].gen.sruns[0].named.wait(NAMED_S)  # the groups' steps get the first ids
            d.standbys.start(lambda node: d._argv((node,), 1, (f"{rejoin.STANDBY_ENV}=1",)), alloc.spares,
                             self.per_node)
        _say(f"{self.groups_n} replica groups on {', '.join('+'.join(g.nodes) for g in groups)}; spares: "
             f"{','.join(alloc.spares) or 'none'}")
        ledger_at = _size(RunDir(d.path).events)
        while any(g.gen.running() for g in groups):
            time.sleep(POLL_S)
            ledger_at = self._joined(groups, ledger_at)
            failed = {g.index for g in groups if not g.out and g.failed} | self._hung(groups)
            if not failed:
                continue
            time.sleep(AT_ONCE_S)
            failed |= {g.index for g in groups if not g.out and g.failed}
            if all(not g.gen.running() and not g.failed for g in groups if g.index not in failed):
                for index in failed:
                    self._kill(groups[index])  # the others ended the run in order: nothing left to join
                continue
            joining = {g.index for g in groups if g.joining}
            refused = plan.refusal(self.groups_n, failed, joining - failed, self.cfg.cluster.replica_min)
            again = sorted(failed & joining)
            if refused is None and again:
                refused = f"replica group(s) {', '.join(map(str, again))} failed again before joining"
            if refused:
                return self._refuse(groups, sorted(failed), refused)
            for index in sorted(failed):
                self._replace(groups[index])
        return Ending()

    def _argv(self, nodes: tuple[str, ...], tasks_per_node: int, group: int, heal: bool,
              env: tuple[str, ...] = ()) -> list[str]:
        return self.d._argv(nodes, tasks_per_node, (f"{plan.GROUP_ENV}={group}", f"{plan.HEAL_ENV}={int(heal)}",
                                                   *env))

    def _joined(self, groups: list[Group], at: int) -> int:
        if not any(g.joining for g in groups):
            return at
        news, at = read_new_events(RunDir(self.d.path).events, at)
        for e in select(news, ReplicaJoin):
            groups[e.details.group].joining = False
        return at

    def _hung(self, groups: list[Group]) -> set[int]:
        """Groups with a rank the heartbeats find silent (the culprit's stacks and `hang` recorded)."""
        monitor = self.d.monitor
        if monitor is None:
            return set()
        size = len(groups[0].nodes) * self.per_node
        running = [g.index * size + r for g in groups if g.gen.running() and not g.out for r in range(size)]
        silent = monitor.silent(running)
        if not silent:
            return set()
        front = monitor.wavefront(running)
        hung = culprits(silent, front)
        nodes = {r: groups[r // size].nodes[(r % size) // self.per_node] for r in running}
        context = {s.rank: self.d._context(groups[s.rank // size].gen.step_id, nodes[s.rank]) for s in hung}
        record_hang(self.d.path, hung, front, running, nodes, {}, context, self.d.cfg.health.node_record)
        return {s.rank // size for s in hung}

    def _kill(self, g: Group) -> None:
        for s in g.gen.sruns:
            if s.proc.poll() is None:
                scontrol.kill_step(self.d.job_id, s.step_id)
        for s in g.gen.sruns:
            s.proc.wait()

    def _replace(self, g: Group) -> None:
        """Group g's step killed; its ranks started anew (a lost node's on a spare), to heal and join."""
        lost = [r.node for r in g.gen.reports if not r.exited]
        self._kill(g)
        placed = placement.replace_group(self.alloc, g.nodes, lost)
        if placed is None:
            g.out = True
            _say(f"replica group {g.index} stays out: no spare for {', '.join(lost)}; the others go on without it")
            return
        self.alloc, nodes = placed
        self.replaced += 1
        generation = self.replaced
        gen = Generation([])
        ranks: dict[int, int] = {}
        for local in range(len(nodes) * self.per_node):
            node = nodes[local // self.per_node]
            s = self.d.standbys.take(node)
            if s is not None:
                gen.adopt(s)
                rejoin.wake(self.d.path, self.d.job_id, self.d.restart, s.step_id or 0, generation)
            else:
                s = gen.start(self._argv((node,), 1, g.index, heal=True, env=(f"{rejoin.JOIN_ENV}={generation}",)),
                              (node,))
            if not s.named.wait(NAMED_S) or s.step_id is None:
                _say(f"srun did not start rank {local} of replica group {g.index} on {node}")
                g.out = True
                return
            ranks[s.step_id] = local
        first = min(ranks)
        rejoin.write_instruction(self.d.path, self.d.job_id, self.d.restart, rejoin.Instruction(
            generation, first, scontrol.node_address(nodes[0]), master_port(self.d.job_id, first), len(ranks),
            ranks, self.per_node, time.time(), replica_group=g.index))
        if self.d.monitor is not None:
            size = len(nodes) * self.per_node
            self.d.monitor.restart_ranks(range(g.index * size, (g.index + 1) * size))
        moved = [f"{a} -> {b}" for a, b in zip(g.nodes, nodes) if a != b]
        g.nodes, g.gen, g.joining = nodes, gen, True
        _say(f"replica group {g.index} starts anew on {'+'.join(nodes)} ({', '.join(moved) or 'in place'}); "
             f"the others go on")

    def _refuse(self, groups: list[Group], failed: list[int], reason: str) -> Ending:
        """Going on is refused: every group's step killed; the failure recorded for the restart budget."""
        lost = tuple(r.node for g in groups if g.index in failed for r in g.gen.reports if not r.exited)
        for g in groups:
            self._kill(g)
        history = read_events(RunDir(self.d.path).events)
        last = max((e.step for e in history if isinstance(e.step, int)), default=None)
        log = self.d._log(groups[0].gen.step_id)
        log.emit(ReplicaRefused(groups=failed, reason=reason), last)
        log.emit(Crash(error=f"ReplicaGroupsLost: {reason}", traceback=""), last)
        _say(f"every process restarts: {reason}")
        return Ending(reason, lost, last, failed)

    # --- after a start
    def _restart_all(self, alloc: Allocation, ending: Ending) -> Allocation:
        """A start of every group anew from the newest checkpoint (spares for the lost nodes), or the
        queue when the allocation cannot hold it, or giving up (the restart budget)."""
        d = self.d
        history = read_events(RunDir(d.path).events)
        decision = recovery.decide(ExitCode.FAILED, None, ending.refused, history, self.cfg.cluster.max_restarts)
        log = d._log(None)
        if decision.action is recovery.Action.GIVE_UP:
            log.emit(GaveUp(reason=decision.reason), ending.last_step)
            raise GaveUpError(decision.reason)
        placed = placement.after_failure(alloc, ending.lost)
        if placed.move is not placement.Move.RESTART:
            why = recovery.Decision(recovery.Action.REQUEUE, f"{ending.refused}; {placed.reason}",
                                    exclude_nodes=tuple(sorted(set(placed.exclude))))
            requeue(d.job_id, why, ending.last_step, self.cfg.cluster.exclude_file,
                    self.cfg.health.exclude_ttl_h * 3600.0, log)
            sys.exit(int(ExitCode.RESUME))
        _say(f"restarting every replica group inside the allocation: {placed.reason}")
        return placed.allocation

    def _conclude(self, began: float) -> str:
        """Every group ended in order: finished, or stopped (the time-limit warning requeues)."""
        d = self.d
        ours = [e for e in read_events(RunDir(d.path).events)
                if (e.job_id, e.restart) == (d.job_id, d.restart) and stamp_seconds(e.time) >= began]
        last = max((e.step for e in ours if isinstance(e.step, int)), default=None)
        if select(ours, Finish):
            return f"finished at step {last}"
        if gave_up := select(ours, GaveUp):
            raise GaveUpError(gave_up[-1].details.reason)
        signals = [e.details.signal for e in select(ours, Signal)]
        if d.stop.requested or not select(ours, Stop) or not signals or signals[0] not in recovery.WARNING_SIGNALS:
            sys.exit(int(ExitCode.RESUME))  # Slurm is ending the job, or a stop it asked for
        decision = recovery.Decision(recovery.Action.REQUEUE, f"{signals[0]}: time-limit warning or preemption "
                                                              f"notice; saved and requeued")
        requeue(d.job_id, decision, last, self.cfg.cluster.exclude_file, self.cfg.health.exclude_ttl_h * 3600.0,
                d._log(None))
        sys.exit(int(ExitCode.RESUME))


def _size(path: Any) -> int:
    try:
        return int(path.stat().st_size)
    except OSError:
        return 0


def _say(message: str) -> None:
    print(f"resilient_slurm driver: {message}", file=sys.stderr, flush=True)
