"""What stops part of the simulated run, or slows it, without a restart of the whole: replica groups
that leave and heal (issue 28's per-step fault tolerance), silent data corruption, and fail-slow
nodes. Pure: time is simulated, and their draws come from a generator of their own, so the
failures a seed draws do not move when these are switched on or off.

- **Replica groups** (`Strategy.replica_ft`): the GPUs form `replica_groups` HSDP groups by rank
  position. A failure on a node stops only its group: every live GPU waits for the detection (a
  crash is seen at once; a hang holds the collective until the heartbeat names it) and a quorum
  change, and redoes the step in flight; the survivors then train on, each step slower
  (`degraded_overhead` x R / (R - 1): the lost group's micro-batches are extra accumulation), while
  the group restarts by its path (in its processes, or new ones after a hang or a CUDA error; a node
  its verdict takes out is replaced by a spare), creates its own communicator, heals from a live
  group over the network and joins at a step boundary, where the quorum changes again. Refused,
  and left to the whole-run restart, for a code bug (every group fails the same step), when fewer
  than `replica_floor` groups would be left, and when no spare can replace a node that must go.
- **Silent data corruption**, on every strategy, at `sdc_gpu_mtbf_h` per GPU. `sdc_nan_share` end
  in NaN, which the NaN rollback catches at once (back to the newest checkpoint, in the process).
  The rest: with the sentinel (`Strategy.sentinel`), found at the step's fingerprint compare and
  the culprit's group healed from a good one (its node replaced); without, found
  `sdc_found_after_h` later, when the run rolls back to the newest checkpoint from before it (a
  restart, and a cold-tier load: that checkpoint is hours old). Every second of either goes to
  `sdc`. A restart to before the corruption undoes it.
- **Spare top-ups** (`Strategy.topup`): whenever `topup_at` usable spares or fewer are left (0:
  none), a job of `topup_nodes` is asked for and its nodes become spares after a queue wait
  (`queue_min_s`-`queue_max_s`; a new job, so no requeue hold). A group that loses a node
  meanwhile waits out for them (the others train on short of it) instead of the whole run
  requeueing. A restart of the whole run gives the lent nodes back (its start is one step of the
  job's own per group), as does a requeue.
- **Stragglers**, on every strategy, at `straggler_gpu_mtbf_h` per GPU: the whole run steps
  `straggler_slowdown` times slower for an exponential `straggler_duration_h`, or, with
  `Strategy.stragglers`, until `straggler_detect_s`, when the slow node's group leaves and heals on
  a spare.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable
from typing import Any

from resilient_slurm.health.verdict import Verdict
from resilient_slurm.health.xid_catalog import Action
from resilient_slurm.checkpoint.policy import SaveClock
from resilient_slurm.simulate import costs
from resilient_slurm.simulate.failures import FailureProcess, Fault, Strike
from resilient_slurm.simulate.saving import INF, Saving
from resilient_slurm.slurm import placement


class Partial(Saving):
    rng: random.Random
    process: FailureProcess
    in_use: set[str]
    lost: dict[str, float]
    paths: Counter[str]
    interruptions: Counter[str]
    excluded: Counter[str]
    out_until: dict[str, float]
    dead: set[str]
    fail_at: float
    horizon: float
    trace: Any

    @abstractmethod
    def _down(self, segments: costs.Segments, kind: str) -> None: ...

    @abstractmethod
    def _verdict(self, fault: Fault, now: float) -> Verdict | None: ...

    @abstractmethod
    def _set_alloc(self, alloc: placement.Allocation) -> None: ...

    @abstractmethod
    def _fresh(self, count: int) -> tuple[str, ...]: ...

    def _init_partial(self, seed: int) -> None:
        s = self.s
        self.silent = random.Random(f"{seed}:silent")
        self.groups_out: dict[int, float] = {}
        """Replica groups healing → when each joins again (INF: waiting for a spare top-up)."""
        self.waiting: dict[int, tuple[str, bool, costs.Segments]] = {}
        """Groups out for want of a spare → (the node they lost, whether it leaves for good, their restart)."""
        self.lent: set[str] = set()
        """Nodes spare top-up jobs hold for the run."""
        self.topup_at = INF
        self.sdc_at = self._draw(s.sdc_gpu_mtbf_h)
        self.sdc_pending: tuple[float, float] | None = None
        """A silent corruption no one has seen: (when, the work done by then)."""
        self.sdc_found_at = INF
        self.straggle_at = self._draw(s.straggler_gpu_mtbf_h)
        self.slow_until, self.slow_detect_at, self.slow_node = 0.0, INF, ""

    def _draw(self, gpu_mtbf_h: float) -> float:
        return self.t + self.silent.expovariate(self.s.gpus / (gpu_mtbf_h * 3600.0)) if gpu_mtbf_h else INF

    def _partial_events(self) -> list[tuple[float, Callable[[], None]]]:
        events = [(self.sdc_at, self._on_sdc), (self.sdc_found_at, self._on_sdc_found),
                  (self.straggle_at, self._on_straggle), (self.slow_detect_at, self._on_slow_detected)]
        if self.t < self.slow_until:
            events.append((self.slow_until, self._on_slow_end))
        if self.groups_out:
            events.append((min(self.groups_out.values()), self._on_join))
        events.append((self.topup_at, self._on_topup))
        return events

    def _speeds(self) -> list[tuple[str, float]]:
        """What slows the training now, each as (the cause its loss goes to, the speed it leaves)."""
        out = []
        if self.t < self.slow_until:
            out.append(("straggler", 1.0 / self.s.straggler_slowdown))
        if self.groups_out:
            live = self.s.replica_groups - len(self.groups_out)
            out.append(("degraded", live / self.s.replica_groups / self.s.degraded_overhead))
        if self.st.sentinel:
            out.append(("sentinel", self.s.step_s / (self.s.step_s + self.s.fingerprint_s)))
        return out

    # --- replica groups
    def _group_fails(self, strike: Strike) -> bool:
        """A failure under per-step fault tolerance; False: refused, the whole run restarts."""
        fault, node = strike.fault, strike.node
        if fault.code_bug:
            self.paths["whole run: a code bug fails every group"] += 1
            return False
        verdict = self._verdict(fault, self.t)
        action = verdict.action if verdict is not None and not verdict.ok else None
        leaves = fault.node_down or strike.recurrence or action not in (None, Action.RESET_GPU)
        away = action == Action.RESET_GPU
        detect = costs.detection(self.s, fault.hang, self.st.heartbeat)
        _, before, after = costs.restart_path(self.s, self.st, fault, replaced=leaves or away)
        refused = self._group_leave(node, leaves, away, detect, before + after, str(fault.name))
        if refused:
            self.paths[f"whole run: {refused}"] += 1
        self.excluded["health verdict"] += not refused and action is not None
        return not refused

    def _group_leave(self, node: str, leaves: bool, away: bool, detect: costs.Segments,
                     restart: costs.Segments, why: str) -> str | None:
        """`node`'s group leaves: the survivors wait for `detect` and a quorum and train on; the group
        restarts (`restart`), on a spare for a node that `leaves` (or is `away` for a repair).
        Refused (the reason returned) below the floor of live groups, or without a spare."""
        s = self.s
        group = self.alloc.in_use.index(node) * s.replica_groups // len(self.alloc.in_use)
        if group not in self.groups_out and s.replica_groups - len(self.groups_out) - 1 < s.replica_floor:
            return f"fewer than {s.replica_floor} live groups"
        placed = None
        if leaves or away:
            placed = placement.after_failure(self.alloc, {node} if leaves else set(), {node} if away else set())
            if placed.move is not placement.Move.SPARE or not placed.added:
                if not self.st.topup:
                    return "no spare for the group"
                placed = None  # it waits out for the top-up (`_on_topup`)
                self.waiting[group] = (node, leaves, restart)
                self.process.forget({node})
                self._ask_topup()
        self.paths[f"group heal ({why})"] += 1
        if group not in self.groups_out:  # a healing group's node: the others do not wait for it
            redo = min(s.step_s / 2, self.work)  # the step in flight, discarded by every group
            self.work -= redo
            self.lost["redone"] += redo
            self._down(detect + [("quorum", s.quorum_s)], "group leaves")
        if placed is not None:
            self._take_spare(placed, node, leaves)
        join = INF if group in self.waiting else self._joins_at(restart)
        self.groups_out[group] = max(self.groups_out.get(group, 0.0), join)
        self.fail_at = self.process.next_at(self.t, self.in_use, self.rng)
        return None

    def _take_spare(self, placed: placement.Placement, node: str, leaves: bool) -> None:
        """A spare takes `node`'s place; the node is gone for good (`leaves`), or away for a repair."""
        self._set_alloc(placed.allocation)
        self.process.forget({node})
        if leaves:
            self.dead.add(node)
        else:
            self.out_until[node] = self.t + self.s.reset_s

    def _joins_at(self, restart: costs.Segments) -> float:
        """When a group that restarts now by `restart` joins: its path, its own communicator, the heal
        from a live group, then a step boundary."""
        s = self.s
        return (self.t + sum(seconds for _, seconds in restart) + s.comm_init(s.gpus // s.replica_groups)
                + s.heal_seconds + s.step_s / 2)

    # --- spare top-ups
    def _ask_topup(self) -> None:
        """`topup_at` usable spares or fewer, and none on its way: a top-up job is asked for."""
        usable = sum(n not in self.alloc.failed for n in self.alloc.spares)
        if self.st.topup and self.topup_at == INF and usable <= self.s.topup_at:
            self.topup_at = self.t + self.silent.uniform(self.s.queue_min_s, self.s.queue_max_s)
            self.paths["spare top-up asked"] += 1

    def _on_topup(self) -> None:
        """The top-up job runs: its nodes are spares, and each group waiting for one starts on one."""
        self.topup_at = INF
        nodes = self._fresh(self.s.topup_nodes)
        self.lent |= set(nodes)
        self._set_alloc(placement.lent(self.alloc, nodes))
        for group, (node, leaves, restart) in sorted(self.waiting.items()):
            placed = placement.after_failure(self.alloc, {node} if leaves else set(), set() if leaves else {node})
            if placed.move is not placement.Move.SPARE or not placed.added:
                break  # more groups wait than the job brought: the next top-up
            del self.waiting[group]
            self._take_spare(placed, node, leaves)  # which asks for the next top-up at `topup_at`
            self.groups_out[group] = self._joins_at(restart)

    def _give_back(self) -> set[str]:
        """A restart of the whole run (or a requeue): the lent nodes leave; those it used are returned."""
        lent, self.lent, self.topup_at = self.lent, set(), INF
        for group in self.waiting:
            self.groups_out.pop(group, None)
        self.waiting.clear()
        if lent:
            self._set_alloc(placement.without(self.alloc, lent))
        return lent

    def _fresh_group(self) -> costs.Segments:
        """A group whose node is swapped for a spare though nothing crashed: it restarts in its processes."""
        return costs.in_process(self.s, True) + costs.after_load(self.s)

    def _on_join(self) -> None:
        group = min(self.groups_out, key=self.groups_out.__getitem__)
        del self.groups_out[group]
        self._down([("quorum", self.s.quorum_s)], "group joins")

    # --- silent data corruption
    def _on_sdc(self) -> None:
        self.sdc_at = self._draw(self.s.sdc_gpu_mtbf_h)
        node = self.silent.choice(self.alloc.in_use)
        if self.silent.random() < self.s.sdc_nan_share:
            self.interruptions["sdc (NaN: rolled back)"] += 1
            return self._roll_back(self.work, late=False)
        if self.st.sentinel and self.st.replica_ft:
            self.interruptions["sdc (caught by the sentinel)"] += 1
            refused = self._group_leave(node, True, False, [], self._fresh_group(), "sdc")
            if refused:
                self.paths[f"sdc rolled back: {refused}"] += 1
                self._roll_back(self.work, late=False)
            return
        self.interruptions["sdc (silent)"] += 1
        if self.sdc_pending is None:
            self.sdc_pending = (self.t, self.work)
            self.sdc_found_at = self.t + self.s.sdc_found_after_h * 3600.0

    def _on_sdc_found(self) -> None:
        assert self.sdc_pending is not None
        _, work = self.sdc_pending
        self.interruptions["sdc (found late: rolled back)"] += 1
        self._roll_back(work, late=True)

    def _roll_back(self, before_work: float, late: bool) -> None:
        """Back to the newest checkpoint from before the corruption: one in the node's memory, in
        the process, when the NaN showed it at once (`late` False); otherwise the newest the disk
        tiers committed before it, after a restart, from the cold tier."""
        s = self.s
        target = max((w for _, w in self.commits if w <= before_work), default=0.0)
        newest = self.memory.usable() if self.memory is not None and not late else None
        from_memory = newest is not None and target <= newest.work <= before_work
        if newest is not None and from_memory:
            target = newest.work
        self.lost["sdc"] += self.work - target
        self.work = target
        self.sdc_pending, self.sdc_found_at = None, INF
        self.pending, self.sync_save, self.after_save, self.grow = None, None, None, None
        self.blocked_until = self.t
        if late:
            restart = s.in_alloc_restart_s if self.st.in_allocation else s.restart_s
            down = restart + s.comm_init() + s.cold_load_s
            self.groups_out.clear()
            if self.memory is not None:
                self.memory.clear()
        else:
            down = s.memory_load_s if from_memory else s.load_s
        self._down([("sdc", down)], "sdc rollback")
        self.clock = SaveClock(self._step(), self.t)
        self._schedule_save()
        if self.memory is not None:
            self.memory.resume(self.t, self._step(), self._mtbf_s())
        self.fail_at = self.process.next_at(self.t, self.in_use, self.rng)

    def _after_restart(self, resumed: float) -> None:
        """The whole run restarted from `resumed`: every group with it; a corruption not yet seen
        is gone if the checkpoint is older than it."""
        self.groups_out.clear()
        if self.sdc_pending is not None and resumed < self.sdc_pending[1]:
            self.sdc_pending, self.sdc_found_at = None, INF

    # --- stragglers
    def _on_straggle(self) -> None:
        self.straggle_at = self._draw(self.s.straggler_gpu_mtbf_h)
        self.interruptions["straggler"] += 1
        end = self.t + self.silent.expovariate(1.0 / (self.s.straggler_duration_h * 3600.0))
        if self.t >= self.slow_until:
            self.slow_node = self.silent.choice(self.alloc.in_use)
            if self.st.stragglers and self.st.replica_ft:
                self.slow_detect_at = self.t + self.s.straggler_detect_s
        self.slow_until = max(self.slow_until, end)

    def _on_slow_end(self) -> None:
        self.slow_until, self.slow_detect_at = self.t, INF

    def _on_slow_detected(self) -> None:
        self.slow_detect_at = INF
        if self.t >= self.slow_until or self.slow_node not in self.in_use:
            return
        refused = self._group_leave(self.slow_node, True, False, [], self._fresh_group(), "straggler")
        if refused:
            self.paths[f"straggler kept: {refused}"] += 1
        else:
            self.slow_until = self.t
