"""One simulated run, event by event, with every decision taken by the project's own code. Pure:
time is simulated and every random draw comes from the run's seeded generator.

What decides, and where the run asks:
- when to save: `checkpoint.policy.next_due_s` with the fixed interval or the Young-Daly one from
  `checkpoint.interval` (`choose_interval`, `mtbf_s`), fed by `checkpoint.costs.save_costs` and the
  failures seen so far, updated after every save and at every resume, as the checkpointer does;
- whether a node leaves: `health.verdict` judges the Xid the fault left in the node's kernel log;
- what to do after a failure: `recovery.decide` on the ledger (restart budget, crash-loop guard,
  node classification), and for in-allocation strategies `slurm.placement` (spare, shrink,
  requeue; growing back at a checkpoint boundary);
- which nodes a requeued job may not get: `health.exclude_list`, as the job's requeue writes it;
- what an emergency save before a planned stop can hold: `checkpoint.deadline.choose_plan`.

With a memory tier (`memory.py`), the disk tier's Young-Daly interval counts only the failures the
memory tier could not serve (restarts that read the disk): the disk is for what outlives them.

Time accounting, in seconds of the whole target allocation (the caller turns them into GPU-hours):
the surviving work `work` is productive; everything else is lost to one of `costs.CAUSES`.
Work accrues at (nodes in use / target nodes) per second, so a shrunk run makes less progress and
the missing part counts as `shrink`. Failures strike only while the job trains (a requeued job
holds no nodes; a restarting one is not yet exposed to its step's faults).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from resilient_slurm import recovery
from resilient_slurm.checkpoint.deadline import choose_plan
from resilient_slurm.checkpoint.costs import save_costs
from resilient_slurm.checkpoint.interval import FailureHistory, Interval, choose_interval, mtbf_s
from resilient_slurm.checkpoint.policy import SaveClock
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health import exclude_list
from resilient_slurm.health.kernel_log import XidEvent
from resilient_slurm.health.verdict import Verdict, check_xid_events
from resilient_slurm.health.verdict import decide as judge
from resilient_slurm.health.xid_catalog import CATALOG, Action
from resilient_slurm.ledger import Crash, GaveUp, Hang, NodeUnhealthy, Requeue, RestartInAllocation, Signal, Stop
from resilient_slurm.simulate import costs
from resilient_slurm.simulate.failures import FailureProcess, Fault
from resilient_slurm.simulate.history import JOB_ID, Ledger
from resilient_slurm.simulate.memory import MemoryTier
from resilient_slurm.simulate.partial import Partial
from resilient_slurm.simulate.saving import INF
from resilient_slurm.simulate.scenario import Scenario, Strategy
from resilient_slurm.simulate.tiers import Tiers
from resilient_slurm.slurm import placement
from resilient_slurm.slurm.placement import Allocation, Move

PEER_ERROR = "RuntimeError: NCCL communicator was aborted: connection closed by peer"
WEIGHTS_SHARE = 1 / 3
"""fp32 weights beside AdamW's two moments: what a weights-only emergency save writes."""


@dataclass
class Trace:
    """One run's timeline for the plot: (t, work, nodes) samples, failures, and down intervals."""

    samples: list[tuple[float, float, int]]
    failures: list[tuple[float, str]]
    downs: list[tuple[float, float, str]]


class Run(Partial):
    def __init__(self, s: Scenario, strategy: Strategy, seed: int, ledger: Ledger | None = None,
                 trace: bool = False) -> None:
        self.s, self.st = s, strategy
        self.rng = random.Random(seed)
        self.process = FailureProcess(s.faults, s.gpus_per_node, s.gpu_mtbf_h)
        self.ledger = ledger or Ledger()
        self.horizon = s.horizon_s
        self.target = s.nodes
        self.t = 0.0
        self.work = 0.0
        self.lost = dict.fromkeys(costs.CAUSES, 0.0)
        self.restarts: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        """Restarts inside the allocation by path: in process, or a step restart (and why)."""
        self.interruptions: Counter[str] = Counter()
        """By fault row; "<row> again" for a latent bad node or a code bug striking again; planned stops."""
        self.excluded: Counter[str] = Counter()
        self.saves = 0
        self.commits: list[tuple[float, float]] = []
        self.intervals: list[float] = []
        """Every Young-Daly interval chosen (after each save and at each resume)."""
        self.tiers = Tiers(s.cold_copy_s)
        self.exclude: dict[str, exclude_list.ExcludeEntry] = {}
        self.out_until: dict[str, float] = {}
        """Nodes away for a repair → when they are healthy again (in-allocation strategies)."""
        self.dead: set[str] = set()
        """Nodes gone for good: drained by their verdict, or down."""
        self.serial = 0
        self.spare_node_s = 0.0
        """Node-seconds of idle spares held (what the spares cost: a node that failed leaves the
        job, as Slurm removes it from a --no-kill job's allocation and its billing)."""
        self.spares_since = 0.0
        self.bug: tuple[float, Fault] | None = None
        """A code bug: the work at which it strikes on every attempt, and its fault."""
        self.interval: Interval | None = None
        self.clock = SaveClock(0, 0.0)
        self.blocked_until = 0.0
        self.blocked_by = "checkpoint"
        """The cause the blocked time is lost to: a disk save, or a memory-tier one."""
        self.memory = MemoryTier(s.memory_every_steps * s.step_s, s.memory_blocking_s, s.memory_save_s, s.step_s,
                                 s.max_interval_s) if strategy.memory else None
        self.disk_restarts = 0
        """Restarts after a failure that read the disk tiers (with a memory tier)."""
        self.sync_save: tuple[float, int] | None = None
        self.pending: tuple[float, float, int] | None = None
        """An async save in flight: (commit at, work, step)."""
        self.after_save: str | None = None
        """What a synchronous save at a boundary leads to: "grow" or "stop"."""
        self.grow: placement.Placement | None = None
        self.save_at = INF
        self.fail_at = INF
        self.planned_at = self._draw_planned()
        self.trace = Trace([], [], []) if trace else None
        spares = s.spares if strategy.in_allocation else 0
        nodes = self._fresh(self.target + spares)
        self.alloc = Allocation(nodes[:self.target], nodes[self.target:], self.target,
                                s.floor_nodes if strategy.elastic else self.target)
        self.in_use = set(self.alloc.in_use)
        self._init_partial(seed)
        self._start(self.t)

    # --- the loop
    def run(self) -> Run:
        while self.t < self.horizon:
            t_next, handler = self._next()
            if t_next >= self.horizon:
                self._advance(self.horizon)
                break
            self._advance(t_next)
            handler()
        if self.trace is not None:
            self.trace.samples.append((self.t, self.work, len(self.alloc.in_use)))
        self._count_spares()
        return self

    def _next(self) -> tuple[float, Callable[[], None]]:
        """The earliest of what can happen next, and its handler."""
        handler: Callable[[], None]
        best, handler = self.fail_at, self._on_failure
        if self.blocked_until > self.t and self.blocked_until < best:
            best, handler = self.blocked_until, self._on_unblocked
        if self.pending is not None and self.pending[0] < best:
            best, handler = self.pending[0], self._on_commit
        if self.save_at < best:
            best, handler = self.save_at, self._on_save_due
        if self.bug is not None:
            start = max(self.t, self.blocked_until)
            at = start + max(self.bug[0] - self.work, 0.0) * self.target / len(self.alloc.in_use) / self._speed()
            if at < best:
                best, handler = at, self._on_bug
        if self.memory is not None:
            if self.memory.pending is not None and self.memory.pending[0] < best:
                best, handler = self.memory.pending[0], self._on_memory_commit
            if self.memory.due_at < best:
                best, handler = self.memory.due_at, self._on_memory_due
        if self.planned_at < best:
            best, handler = self.planned_at, self._on_planned
        for at, on in self._partial_events():
            if at < best:
                best, handler = at, on
        if self.out_until:
            at = min(self.out_until.values())
            if at < best:
                best, handler = at, self._on_returned
        return best, handler

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        share = len(self.alloc.in_use) / self.target
        if self.t < self.blocked_until:
            self.lost[self.blocked_by] += share * dt
        else:
            rate = share
            for cause, speed in self._speeds():  # each slowdown's loss, in turn, of what is left
                self.lost[cause] += rate * (1.0 - speed) * dt
                rate *= speed
            self.work += rate * dt
        self.lost["shrink"] += (1.0 - share) * dt
        self.t = t

    def _speed(self) -> float:
        out = 1.0
        for _, speed in self._speeds():
            out *= speed
        return out

    def _down(self, segments: costs.Segments, kind: str) -> None:
        """Time passes without training; each segment is lost to its cause."""
        begin = self.t
        for cause, seconds in segments:
            spent = min(seconds, self.horizon - self.t)
            self.lost[cause] += spent
            self.t += spent
        if self.trace is not None:
            self.trace.downs.append((begin, self.t, kind))

    # --- saves (the rest: saving.py)
    def _on_unblocked(self) -> None:
        if self.sync_save is None:
            return
        work, step = self.sync_save
        self.sync_save = None
        self.clock = SaveClock(step, self.t)
        self._commit(work, step, blocking_s=self.s.save_s)
        then, self.after_save = self.after_save, None
        if then == "grow":
            self._grow_now()
        elif then == "stop":
            self._requeue_after_stop()
        else:
            self._schedule_save()

    # --- the Young-Daly interval (saving.py has the rest of the saves)
    def _update_interval(self) -> None:
        """As the checkpointer does after each save and at resume (Young-Daly only)."""
        if self.st.saves != "young_daly":
            return
        measured = save_costs(list(self.ledger.recent_saves))
        if measured.blocking_s is None:
            return
        mtbf = self._mtbf_s() if self.memory is None else self._disk_mtbf_s()
        self.interval = choose_interval(measured.blocking_s, measured.total_s or 0.0, mtbf, self.s.min_interval_s,
                                        self.s.max_interval_s)
        self.intervals.append(self.interval.seconds)

    def _mtbf_s(self) -> float:
        return mtbf_s(self.ledger.failure_history(self.t), self.s.mtbf_prior_h * 3600.0)

    def _disk_mtbf_s(self) -> float:
        seen = self.ledger.failure_history(self.t)
        return mtbf_s(FailureHistory(self.disk_restarts, seen.exposure_s), self.s.mtbf_prior_h * 3600.0)

    # --- failures
    def _on_failure(self) -> None:
        strike = self.process.strike(self.alloc.in_use, self.in_use, self.rng)
        self.interruptions[f"{strike.fault.name} again" if strike.recurrence else strike.fault.name] += 1
        if strike.fault.code_bug and self.bug is None:
            self.bug = (self.work, strike.fault)
        if self.st.replica_ft and self._group_fails(strike):
            return
        self._fail(strike.fault, strike.node, strike.at_start)

    def _on_bug(self) -> None:
        assert self.bug is not None
        self.work = max(self.work, self.bug[0])
        self.interruptions[f"{self.bug[1].name} again"] += 1
        self._fail(self.bug[1], self.rng.choice(self.alloc.in_use))

    def _fail(self, fault: Fault, node: str, at_start: bool = False) -> None:
        if self.trace is not None:
            self.trace.failures.append((self.t, fault.name))
            self.trace.samples.append((self.t, self.work, len(self.alloc.in_use)))
        step = None if at_start else self._step()
        waited = sum(seconds for _, seconds in costs.detection(self.s, fault.hang, self.st.heartbeat))
        detected = self.t + waited
        if fault.hang:
            self.ledger.emit(detected, Hang(reason=fault.error, waited_s=waited, limit_s=waited, stacks=""), step,
                             node)
        else:
            self.ledger.emit(detected, Crash(error=fault.error, traceback=""), step, node)
            peer = self.alloc.in_use[(self.alloc.in_use.index(node) + 1) % len(self.alloc.in_use)]
            self.ledger.emit(detected, Crash(error=PEER_ERROR, traceback=""), step, peer)
        verdict = self._verdict(fault, detected)
        action = verdict.action if verdict is not None and not verdict.ok else None
        if verdict is not None and action is not None:
            self.ledger.emit(detected, NodeUnhealthy(bad_node=node, action=action.label, xid=verdict.xid,
                                                            reason=verdict.reason, notes=[]), None)
        error = f"hang: {fault.error}" if fault.hang else fault.error
        decision = recovery.decide(ExitCode.FAILED, None, error, self.ledger.window, self.s.max_restarts)
        self.ledger.end(detected, failed=True)
        # Nodes that failed (never again in this allocation) and nodes away for a GPU reset.
        failed = {node} if fault.node_down or action not in (None, Action.RESET_GPU) else set()
        out = {node} if action == Action.RESET_GPU else set()
        self.excluded["health verdict"] += action is not None
        guard = set(decision.exclude_nodes) - failed - out
        self.excluded["crash-loop guard"] += len(guard)
        self.dead |= failed
        failed |= guard
        segments = costs.detection(self.s, fault.hang, self.st.heartbeat)
        if decision.action is recovery.Action.GIVE_UP:
            self.ledger.emit(detected, GaveUp(reason=decision.reason), step)
            self.bug = None
            if node in self.process.latent:  # whoever looks at the log finds the node the failures follow
                failed.add(node)
            segments.append(("manual", self.s.manual_h * 3600.0))
            return self._requeue(segments, decision.exclude_nodes, failed | out, kind="gave up")
        if not self.st.in_allocation:
            self.ledger.emit(detected, Requeue(reason=decision.reason, ok=True,
                                                      exclude=list(decision.exclude_nodes)), step)
            return self._requeue(segments, decision.exclude_nodes, failed | out,
                                 kind="requeue, excluding" if decision.exclude_nodes else "requeue")
        lent = self._give_back()  # every group restarts, each as a step of the job's own
        if self.memory is not None:
            self.memory.lose(failed | out | lent)
        placed = placement.after_failure(self.alloc, failed, out)
        for n in out:
            self.out_until[n] = detected + self.s.reset_s
        if placed.move is Move.REQUEUE:
            exclude = tuple(sorted(set(decision.exclude_nodes) | set(placed.exclude)))
            self.ledger.emit(detected, Requeue(reason=f"{decision.reason}; {placed.reason}", ok=True,
                                                      exclude=list(exclude)), step)
            return self._requeue(segments, exclude, failed | out, kind="requeue, out of spares")
        kind = placed.move.value
        self.ledger.emit(detected, RestartInAllocation(cause=decision.reason, placement=placed.reason,
                                                              replaced=sorted(failed | out), added=list(placed.added)),
                         step)
        self._set_alloc(placed.allocation)
        path, before, after = costs.restart_path(self.s, self.st, fault, replaced=bool(failed | out))
        self.paths[path] += 1
        self._restart(segments + before, cold=False, kind=kind, replaced=bool(failed | out), after=after)

    def _verdict(self, fault: Fault, now: float) -> Verdict | None:
        if fault.xid is None:
            return None
        event = XidEvent(fault.xid, "0000:1b:00", f"Xid {fault.xid}: {fault.error}", rst=fault.xid_rst)
        return judge(check_xid_events([event], CATALOG, (), JOB_ID, now, 86400.0))

    # --- getting back to training
    def _requeue(self, segments: costs.Segments, exclude: tuple[str, ...], gone: set[str], kind: str) -> None:
        """The job leaves its allocation: the exclude list gets the decision's nodes (as the job's
        requeue writes it), and the new allocation is the old one less the excluded nodes, the
        nodes that are down or drained and any still away, topped up with fresh nodes."""
        self._give_back()
        for n in exclude:
            entry = exclude_list.new_entry(n, reason="excluded by the recovery decision", now=self.t, job_id=JOB_ID,
                                           ttl_s=self.s.exclude_ttl_h * 3600.0)
            self.exclude = exclude_list.with_entry(self.exclude, entry, self.t)
        segments = segments + costs.requeue(self.s, self.rng)
        allocated_at = self.t + sum(seconds for _, seconds in segments)
        barred = {e.node for e in exclude_list.active(self.exclude, allocated_at)}
        barred |= self.dead | gone | set(self.out_until)
        self.process.forget(gone)
        self.out_until.clear()
        if self.memory is not None:  # the tier belongs to the allocation
            self.memory.clear()
        old = self.alloc
        keep = [n for n in old.in_use + old.spares if n not in barred]
        spares = self.s.spares if self.st.in_allocation else 0
        nodes = tuple(keep[:self.target + spares]) + self._fresh(self.target + spares - len(keep))
        self.topup_at = INF  # a new allocation: the old one's top-up is not waited for
        self._set_alloc(Allocation(nodes[:self.target], nodes[self.target:], self.target, old.min_nodes))
        replaced = set(self.alloc.in_use) != set(old.in_use)
        self._restart(segments, cold=replaced and not self.st.in_allocation, kind=kind)

    def _restart(self, segments: costs.Segments, cold: bool, kind: str, replaced: bool = False,
                 after: costs.Segments | None = None) -> None:
        """Lose what the last usable checkpoint does not hold, wait, load, train again. `cold`: a
        node's hot copy is gone (and no buddy holds one), so only cold-tier copies can be used.
        The memory tier comes first when it holds a complete save (`replaced`: a node left, so its
        ranks read the buddy's copy); `after`: what follows the load (an in-process restart's)."""
        self.restarts[kind] += 1
        in_memory = self.memory.usable() if self.memory is not None else None
        usable = self.tiers.newest(self.t, cold)
        self.tiers.abandon(self.t)
        if in_memory is not None:
            resumed = in_memory.work
            load = costs.memory_load(self.s, replaced)
        else:
            resumed = usable.work if usable else 0.0
            load = costs.load(self.s, cold and usable is not None)
            if self.memory is not None and kind not in ("planned stop", "grow back"):
                self.disk_restarts += 1
        self.lost["redone"] += self.work - resumed
        self.work = resumed
        self._after_restart(resumed)
        if self.trace is not None:
            self.trace.samples.append((self.t, self.work, len(self.alloc.in_use)))
        self.pending, self.sync_save, self.after_save, self.grow = None, None, None, None
        self.blocked_until = self.t
        self._down(segments, kind)
        start = self.t
        # Every restart of the whole run creates the world's communicators anew.
        self._down(load + (after or []) + [("comm_init", self.s.comm_init())], "load")
        if self.t < self.horizon:
            self._start(start)

    def _start(self, started: float) -> None:
        """A new attempt: `start` in the ledger (before the load), then the checkpointer's resume."""
        if self.trace is not None:
            self.trace.samples.append((self.t, self.work, len(self.alloc.in_use)))
        self.ledger.start(started, len(self.alloc.in_use))
        self.clock = SaveClock(self._step(), self.t)
        self.tiers.resume(self.t)
        self._update_interval()
        self._schedule_save()
        if self.memory is not None:
            self.memory.resume(self.t, self._step(), self._mtbf_s())
        self.fail_at = self.process.next_at(self.t, self.in_use, self.rng)

    # --- planned stops, returns, growing back
    def _draw_planned(self) -> float:
        rate = self.s.planned_per_day / 86400.0
        return self.t + self.rng.expovariate(rate) if rate else INF

    def _on_planned(self) -> None:
        """Maintenance: the warning signal, an emergency save that fits, then a requeue."""
        self.planned_at = self._draw_planned()
        self.interruptions["planned stop"] += 1
        inflight = max(self.pending[0] - self.t, 0.0) if self.pending else 0.0
        write = self.s.ckpt_bytes / self.s.save_s
        plan = choose_plan(self.s.signal_lead_s - self.s.emergency_reserve_s, int(self.s.ckpt_bytes),
                           int(self.s.ckpt_bytes * WEIGHTS_SHARE), write, inflight, None)
        self.ledger.emit(self.t, Signal(signal="SIGUSR1", received=""), self._step())
        if self.sync_save is not None:  # a save is being written: stop right after it
            self.after_save = "stop"
        elif plan.save and self.st.saves != "none":
            if self.pending is not None:
                self.blocked_until, self.blocked_by = self.pending[0], "checkpoint"
                self._advance(self.pending[0])
                self._on_commit()
            self.after_save = "stop"
            self._save_sync()
        else:
            self._requeue_after_stop()

    def _requeue_after_stop(self) -> None:
        self.ledger.emit(self.t, Stop(reason="planned maintenance", checkpoint=None), self._step())
        decision = recovery.decide(ExitCode.RESUME, "SIGUSR1", None, self.ledger.window, self.s.max_restarts)
        self.ledger.end(self.t, failed=False)
        assert decision.action is recovery.Action.REQUEUE, decision.reason
        self._requeue([], decision.exclude_nodes, set(), kind="planned stop")

    def _on_returned(self) -> None:
        node = min(self.out_until, key=self.out_until.__getitem__)
        del self.out_until[node]
        self._set_alloc(placement.returned(self.alloc, node))

    def _grow_now(self) -> None:
        assert self.grow is not None
        self.ledger.emit(self.t, Stop(reason=self.grow.reason, checkpoint=None), self._step())
        self.ledger.end(self.t, failed=False)
        self._set_alloc(self.grow.allocation)
        self._restart(costs.in_allocation(self.s), cold=False, kind="grow back")

    # --- helpers
    def _count_spares(self) -> None:
        now = min(self.t, self.horizon)
        idle = sum(n not in self.alloc.failed for n in self.alloc.spares)
        self.spare_node_s += idle * max(now - self.spares_since, 0.0)
        self.spares_since = now

    def _set_alloc(self, alloc: Allocation) -> None:
        self._count_spares()
        self.alloc = alloc
        self.in_use = set(alloc.in_use)
        self._ask_topup()

    def _fresh(self, count: int) -> tuple[str, ...]:
        names = tuple(f"n{self.serial + i:05d}" for i in range(max(count, 0)))
        self.serial += len(names)
        return names
