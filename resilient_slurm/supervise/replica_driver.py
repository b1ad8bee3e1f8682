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
others go on without it. With cluster.spare_topup, whenever few usable spares are left
(cluster.spare_topup_at; by default none) the driver asks Slurm for more in a job of their own
(`slurm/topup.py`); once it runs, its nodes are spares that a group's ranks start on as steps of
that job, and a group that stayed out starts there at once. A straggler (`monitor.straggler`) is
recorded, and with a spare its group is replaced the same way at once, its node left out; the
others train on. So is the group of a node a silent data corruption named
(monitor.sdc.leave_node), once the sentinel healed it in place.

Refused (`replica.plan.refusal`: every group lost at once, no live group, fewer than
cluster.replica_min, or a replacement that failed before it joined; one line in the ledger,
`replica_refused`): every step is killed, and the start ends as a failed step does.

Either way, once every group's step has ended, the top-up jobs are given back (their nodes leave the
allocation: a start of every group is one step of the driver's own job per group), and the driver
concludes as it does without groups (`conclusion.conclude` on the start's facts, then `Driver.act`): finished; a failure restarts every
group from the newest checkpoint inside the allocation (the restart budget and the crash-loop guard
of `recovery.decide`; spares for the lost nodes), or through the queue without enough nodes; a
time-limit warning requeues; a stop Slurm asked for is left to Slurm.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Crash, ReplicaJoin, ReplicaRefused, Sdc, SpareTopup, read_events, read_new_events, select
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.replica import plan
from resilient_slurm.replica.lighthouse import Lighthouse
from resilient_slurm.rundir import RunDir
from resilient_slurm.session import rejoin
from resilient_slurm.slurm import placement, scontrol, topup
from resilient_slurm.slurm.env import master_port
from resilient_slurm.slurm.placement import Allocation
from resilient_slurm.slurm.step_end import StepEnd, judge
from resilient_slurm.supervise import conclusion as c
from resilient_slurm.supervise.hangs import record_hang
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor
from resilient_slurm.supervise.job import DriverJob, say
from resilient_slurm.supervise.standby import Standbys
from resilient_slurm.supervise.steps import Generation
from resilient_slurm.supervise.stragglers import record_straggler

Act = Callable[[c.Conclusion, int | None], str | tuple[Allocation, c.PendingRestart]]
"""`Driver.act`: the one place the driver acts on a conclusion."""

POLL_S = 0.05
AT_ONCE_S = 1.0
"""Groups that fail within this of each other failed at once (one cause)."""
NAMED_S = 30.0
"""How long srun may take to name a step it started."""
TOPUP_POLL_S = 1.0
"""How often the driver asks Slurm whether a spare top-up job runs yet."""


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


@dataclass(frozen=True)
class Ending:
    """How a start of every group ended."""

    step_id: int | None
    """The first group's step: the attempt key the driver writes under."""
    refused: str = ""
    lost: tuple[str, ...] = ()
    """Nodes whose tasks vanished in the failure that was refused."""
    decided_at: float = 0.0
    """When the driver refused (0: every group ended by itself)."""


class ReplicaDriver:
    def __init__(self, job: DriverJob, stop: StopRequest, monitor: HeartbeatMonitor | None, standbys: Standbys,
                 act: Act) -> None:
        """The driver's job, stop request, heartbeat monitor and standbys; `act`, its `Driver.act`."""
        self.job, self.stop, self.monitor, self.standbys, self.act = job, stop, monitor, standbys, act
        self.cfg = job.cfg
        self.groups_n = self.cfg.parallel.dp_replicate
        self.per_node = self.cfg.cluster.tasks_per_node
        self.alloc: Allocation | None = None
        self.replaced = 0
        """Replacements started: each has its own instruction file (its `generation` in the name)."""
        self.topups: list[topup.TopUp] = []
        """Spare top-up jobs of this start (cluster.spare_topup): waiting in the queue, or holding nodes."""
        self.lenders: dict[str, str] = {}
        """Node -> the top-up job that holds it for the run."""
        self.topup_refused = False
        self.topup_looked = 0.0
        self.first_step = 0
        """The step of group 0's start: the attempt key the driver records under."""

    def run(self, alloc: Allocation) -> str:
        """Starts of every group until the driver's conclusion is not a restart inside the allocation."""
        k = self.cfg.cluster
        lighthouse = Lighthouse(k.replica_min, k.replica_timeout_s)
        # Every task is told where the groups meet. A group's failure ends its own step and the
        # driver replaces it, so no survivor waits for the driver's word (rejoin off).
        self.job = replace(self.job, launch=replace(self.job.launch, lighthouse=lighthouse.address, rejoin=False))
        try:
            while True:
                if self.stop.requested:
                    self.act(c.LeaveToSlurm("stop requested"), None)
                began = time.time()
                ending = self._start(alloc)
                self.standbys.dismiss(self.job.job_id)
                assert self.alloc is not None
                # The next start is one step of this job per group: lent nodes cannot take part.
                own = placement.without(self.alloc, self.lenders)
                self._give_back(ending.step_id)
                done = self.act(c.conclude(self._ended(ending, began, own)), ending.step_id)
                if isinstance(done, str):
                    return done
                alloc = done[0]
        finally:
            self._give_back(None)
            lighthouse.close()

    # --- one start of every group
    def _start(self, alloc: Allocation) -> Ending:
        per_group = len(alloc.in_use) // self.groups_n
        self.alloc = alloc
        groups = [Group(g, alloc.in_use[g * per_group:(g + 1) * per_group], Generation([]))
                  for g in range(self.groups_n)]
        for g in groups:
            g.gen.start(self._argv(g.nodes, self.per_node, self._told(g.index, heal=False)), g.nodes)
        groups[0].gen.sruns[0].named.wait(NAMED_S)
        self.first_step = groups[0].gen.sruns[0].step_id or 0
        if self.monitor is not None:
            self.monitor.restart(0, len(alloc.in_use) * self.per_node)
        if self.cfg.cluster.standby and alloc.spares:
            groups[-1].gen.sruns[0].named.wait(NAMED_S)  # the groups' steps get the first ids
            self.standbys.start(lambda node: self._argv((node,), 1, replace(self.job.launch, standby=True)),
                             alloc.spares, self.per_node)
        say(f"{self.groups_n} replica groups on {', '.join('+'.join(g.nodes) for g in groups)}; spares: "
            f"{','.join(alloc.spares) or 'none'}")
        ledger_at = _size(RunDir(self.job.path).events)
        # Nodes a healed silent data corruption named, not acted on yet: a poll with a failure
        # replaces the failed groups first, and the next one without moves the named nodes' groups.
        corrupt: list[str] = []
        while any(g.gen.running() for g in groups):
            time.sleep(POLL_S)
            self._top_up(groups)
            ledger_at, named = self._news(groups, ledger_at)
            corrupt += named
            failed = {g.index for g in groups if not g.out and g.failed} | self._hung(groups)
            if not failed:
                swaps = self._stragglers(groups)
                for index, node in swaps + self._corrupted(groups, corrupt, len(swaps)):
                    self._replace(groups[index], out=(node,))
                corrupt = []
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
        return Ending(groups[0].gen.step_id)

    def _told(self, group: int, heal: bool, join: int | None = None) -> RankLaunch:
        return replace(self.job.launch, replica_group=group, replica_heal=heal, join=join)

    def _argv(self, nodes: tuple[str, ...], tasks_per_node: int, launch: RankLaunch) -> list[str]:
        return self.job.argv(nodes, tasks_per_node, launch)

    def _news(self, groups: list[Group], at: int) -> tuple[int, list[str]]:
        """The ledger's events since offset `at`: a replacement's join ends its group's joining; the
        nodes a healed silent data corruption named are returned, with the new offset."""
        news, at = read_new_events(RunDir(self.job.path).events, at)
        for e in select(news, ReplicaJoin):
            groups[e.details.group].joining = False
        return at, [n for e in select(news, Sdc) if e.details.action == "healed" for n in e.details.nodes]

    def _corrupted(self, groups: list[Group], nodes: list[str], planned: int) -> list[tuple[int, str]]:
        """(group, node) for each group to move off a node a silent data corruption named
        (monitor.sdc.leave_node): its state was healed in place from a good group, but the node is
        not trusted, so with a usable spare (beyond the `planned` swaps) the group is replaced at
        once and the others train on; without one it trains on there until the next start leaves
        the node out (the sentinel drained and excluded it)."""
        if not nodes or not self.cfg.monitor.sdc.leave_node:
            return []
        moves: list[tuple[int, str]] = []
        for node in dict.fromkeys(nodes):
            g = next((g for g in groups if node in g.nodes and not g.out and not g.joining), None)
            if g is None or any(i == g.index for i, _ in moves):
                continue
            if self._movable(groups, g, planned + len(moves), moves):
                say(f"silent data corruption on {node}: replica group {g.index} moves to a spare")
                moves.append((g.index, node))
            else:
                say(f"silent data corruption on {node}: no spare; replica group {g.index} trains on there until "
                    f"the next start leaves the node out")
        return moves

    def _movable(self, groups: list[Group], g: Group, planned: int, moves: list[tuple[int, str]]) -> bool:
        """Whether group g can move to a spare now: neither joining nor out nor among the `moves`
        already chosen, a usable spare left beyond the `planned` moves, and a loss the others could
        go on without (`plan.refusal`)."""
        assert self.alloc is not None
        spares = [n for n in self.alloc.spares if n not in self.alloc.failed]
        joining = {x.index for x in groups if x.joining}
        return not g.joining and not g.out and all(i != g.index for i, _ in moves) and len(spares) > planned \
            and plan.refusal(self.groups_n, {g.index}, joining, self.cfg.cluster.replica_min) is None

    def _hung(self, groups: list[Group]) -> set[int]:
        """Groups with a rank the heartbeats find silent (the culprit's stacks and `hang` recorded)."""
        monitor = self.monitor
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
        context = {s.rank: self.job.context(groups[s.rank // size].gen.step_id, nodes[s.rank]) for s in hung}
        record_hang(self.job.path, hung, front, running, nodes, {}, context, self.cfg.health.node_record,
                    self.job.job_id)
        return {s.rank // size for s in hung}

    def _stragglers(self, groups: list[Group]) -> list[tuple[int, str]]:
        """Record each straggler found; (group, node) for each whose group is to be replaced with its
        node on a spare at once (monitor.straggler.swap, a usable spare, and a loss the others could
        go on without: `plan.refusal`)."""
        if self.monitor is None:
            return []
        assert self.alloc is not None
        size = len(groups[0].nodes) * self.per_node
        swaps: list[tuple[int, str]] = []
        for s in self.monitor.stragglers():
            g = groups[s.rank // size]
            node = g.nodes[(s.rank % size) // self.per_node]
            swap = self.cfg.monitor.straggler.swap and self._movable(groups, g, len(swaps), swaps)
            record_straggler(self.job.path, s, node, self.job.context(g.gen.step_id, node), "swap" if swap else "report",
                             self.cfg.health.node_record, self.job.job_id, group=g.index)
            say(f"straggler on {node}: {s.describe()}" + (f"; replica group {g.index} moves to a spare" if swap else ""))
            if swap:
                swaps.append((g.index, node))
        return swaps

    def _top_up(self, groups: list[Group]) -> None:
        """cluster.spare_topup: ask Slurm for spares in a job of their own when cluster.spare_topup_at
        usable spares or fewer are left and none is on its way (`topup.wanted`); once one runs, its
        nodes are spares, and each group out for want of a spare starts there. Slurm is asked at
        most every TOPUP_POLL_S. The run's spares are excluded too: a top-up must bring new nodes."""
        k, job = self.cfg.cluster, self.job
        if not k.spare_topup or time.monotonic() - self.topup_looked < TOPUP_POLL_S:
            return
        self.topup_looked = time.monotonic()
        assert self.alloc is not None
        log = job.log(self.first_step)
        for i, top in enumerate(self.topups):
            if top.nodes or top.gone:
                continue
            now = topup.look(top)
            self.topups[i] = now
            if now.gone:
                log.emit(SpareTopup(state="lost", topup_job=top.job_id, nodes=[], reason="it ended before it ran"), None)
            elif now.nodes:
                self.alloc = placement.lent(self.alloc, now.nodes)
                self.lenders.update(dict.fromkeys(now.nodes, now.job_id))
                log.emit(SpareTopup(state="granted", topup_job=now.job_id, nodes=list(now.nodes)), None)
                say(f"spare top-up job {now.job_id} runs: spares {', '.join(now.nodes)}")
                for g in groups:
                    if g.out:
                        self._replace(g)
        usable = [n for n in self.alloc.spares if n not in self.alloc.failed]
        waiting = any(not t.nodes and not t.gone for t in self.topups)
        if not topup.wanted(len(usable), k.spare_topup_at, waiting, self.topup_refused):
            return
        exclude = tuple(dict.fromkeys([*self.alloc.in_use, *self.alloc.spares, *self.alloc.failed, *self.lenders]))
        asked, why = topup.ask(k, job.job_id, exclude, RunDir(job.path).slurm / "topup-%j.out")
        if asked is None:
            self.topup_refused = True  # one line, not one a second: the run goes on without spares
            log.emit(SpareTopup(state="refused", topup_job="", nodes=[], reason=why), None)
            say(f"no spare top-up: {why}")
            return
        self.topups.append(asked)
        log.emit(SpareTopup(state="asked", topup_job=asked.job_id, nodes=[]), None)
        say(f"{len(usable)} usable spare(s) left: asked Slurm for {k.spare_topup} more in job {asked.job_id}")

    def _give_back(self, step: int | None) -> None:
        """Every top-up job cancelled: the next start is one step of this job per group."""
        for top in self.topups:
            if not top.gone:
                topup.give_back(top)
                self.job.log(step).emit(SpareTopup(state="given back", topup_job=top.job_id, nodes=list(top.nodes)),
                                        None)
        self.topups, self.lenders, self.topup_refused = [], {}, False

    def _kill(self, g: Group) -> None:
        for s in g.gen.sruns:
            s.kill(self.job.job_id)
        for s in g.gen.sruns:
            s.proc.wait()

    def _replace(self, g: Group, out: tuple[str, ...] = ()) -> None:
        """Group g's step killed; its ranks started anew (a lost node's on a spare, and each node of
        `out`: a straggler's), to heal and join."""
        assert self.alloc is not None
        job = self.job
        lost = [r.node for r in g.gen.reports if not r.exited] + list(out)
        self._kill(g)
        if self.monitor is not None:
            # The others may have waited for g in a collective or the quorum since before its
            # failure was found; they go on once it is gone, and are not hung for that wait.
            size = len(g.nodes) * self.per_node
            self.monitor.waited(r for r in range(self.groups_n * size) if r // size != g.index)
        placed = placement.replace_group(self.alloc, g.nodes, lost)
        if placed is None:
            g.out = True
            say(f"replica group {g.index} stays out: no spare for {', '.join(lost)}; the others go on without it")
            return
        self.alloc, nodes = placed
        self.replaced += 1
        generation = self.replaced
        gen = Generation([])
        ranks: dict[int, int] = {}
        lent: list[tuple[str, int]] = []
        for local in range(len(nodes) * self.per_node):
            node = nodes[local // self.per_node]
            lender = self.lenders.get(node)
            s = self.standbys.take(node)
            if s is not None:
                gen.adopt(s)
                rejoin.wake(job.path, job.job_id, job.restart, s.step_id or 0, generation)
            elif lender is not None:  # a step of the top-up job, told its rank and the run's job
                told = replace(self._told(g.index, heal=True, join=generation), join_rank=local, host_job=job.job_id,
                               host_restart=job.restart)
                s = gen.start(self.job.argv((node,), 1, told, job_id=lender), (node,), lender=lender)
            else:
                s = gen.start(self._argv((node,), 1, self._told(g.index, heal=True, join=generation)), (node,))
            if not s.named.wait(NAMED_S) or s.step_id is None:
                say(f"srun did not start rank {local} of replica group {g.index} on {node}")
                g.out = True
                return
            if lender is None:
                ranks[s.step_id] = local
            else:
                lent.append((lender, s.step_id))
        # A replacement all on lent nodes has no step of this job to name its attempt by: it writes
        # under the first group's start, the attempt that goes on, and meets at a port its own step
        # in the lending job gives (one this job's steps do not use).
        first = min(ranks) if ranks else self.first_step
        port = master_port(job.job_id, first) if ranks else master_port(*lent[0])
        rejoin.write_instruction(job.path, job.job_id, job.restart, rejoin.Instruction(
            generation, first, scontrol.node_address(nodes[0]), port, len(nodes) * self.per_node,
            ranks, self.per_node, time.time(), replica_group=g.index))
        if self.monitor is not None:
            size = len(nodes) * self.per_node
            self.monitor.restart_ranks(range(g.index * size, (g.index + 1) * size))
        moved = [f"{a} -> {b}" for a, b in zip(g.nodes, nodes) if a != b]
        g.nodes, g.gen, g.joining, g.out = nodes, gen, True, False
        say(f"replica group {g.index} starts anew on {'+'.join(nodes)} ({', '.join(moved) or 'in place'}); "
            f"the others go on")

    def _refuse(self, groups: list[Group], failed: list[int], reason: str) -> Ending:
        """Going on is refused: every group's step killed; the failure recorded for the restart budget."""
        decided_at = time.time()
        lost = tuple(r.node for g in groups if g.index in failed for r in g.gen.reports if not r.exited)
        for g in groups:
            self._kill(g)
        history = read_events(RunDir(self.job.path).events)
        last = max((e.step for e in history if isinstance(e.step, int)), default=None)
        log = self.job.log(groups[0].gen.step_id)
        log.emit(ReplicaRefused(groups=failed, reason=reason), last)
        log.emit(Crash(error=f"ReplicaGroupsLost: {reason}", traceback=""), last)
        say(f"every process restarts: {reason}")
        return Ending(groups[0].gen.step_id, reason, lost, decided_at)

    # --- after a start
    def _ended(self, ending: Ending, began: float, alloc: Allocation) -> c.Ended:
        """The facts of a start of every group, for `conclusion.conclude`: a refusal ends it as a
        failed step; otherwise the groups' own records say how (finished, stopped, gave up, failed)."""
        job = self.job
        history = read_events(RunDir(job.path).events)
        ours = [e for e in history if (e.job_id, e.restart) == (job.job_id, job.restart)
                and stamp_seconds(e.time) >= began]
        last = max((e.step for e in ours if isinstance(e.step, int)), default=None)
        end = StepEnd(ExitCode.FAILED, error=f"ReplicaGroupsLost: {ending.refused}") if ending.refused \
            else judge(ours, [])
        ended_at = time.time()
        return c.Ended(end=end, ours=tuple(ours), history=tuple(history), allocation=alloc, nodes=alloc.in_use,
                       srun_code=None, stop_requested=self.stop.requested, max_restarts=self.cfg.cluster.max_restarts,
                       ended_at=ended_at, lost_nodes=ending.lost, decided_at=ending.decided_at,
                       killed_at=ended_at if ending.refused else 0.0, refused=ending.refused, last_step=last)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
