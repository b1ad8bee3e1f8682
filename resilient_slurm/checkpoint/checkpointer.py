"""The run's checkpointing: when to save, saving (in the background or not) with its ledger entry,
retention, the cold tier, emergency saves against a deadline, and resume.

The job loop calls it from its main thread, on every rank, at the same steps. Work that runs on
threads of its own (the save in flight, the copier to the cold tier) writes its own ledger
entries; `close()` waits for it on every exit path.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm.rundir import RunDir
from resilient_slurm import ledger
from resilient_slurm.checkpoint.collectives import RunCollectives
from resilient_slurm.checkpoint import buddy, layout, load, nodes, store
from resilient_slurm.checkpoint.async_save import AsyncSaver
from resilient_slurm.checkpoint.cold import ColdTier
from resilient_slurm.checkpoint.costs import save_costs
from resilient_slurm.checkpoint.deadline import EmergencyPlan, choose_plan, grace_s
from resilient_slurm.checkpoint.group import checkpoint_group
from resilient_slurm.checkpoint.interval import (
    Interval,
    changed,
    choose_interval,
    failure_history,
    mtbf_s,
)
from resilient_slurm.checkpoint.memory import MemoryTier
from resilient_slurm.checkpoint.memory_policy import memory_due
from resilient_slurm.checkpoint.policy import SaveClock, step_reason, time_due
from resilient_slurm.checkpoint.retention import CheckpointInfo, plan_retention
from resilient_slurm.checkpoint.save import SaveError, SaveResult, save
from resilient_slurm.checkpoint.spread import SpreadResume
from resilient_slurm.checkpoint.state import Snapshot
from resilient_slurm.checkpoint.uploader import Uploader
from resilient_slurm.config import CheckpointConfig, ClusterConfig
from resilient_slurm.ledger import EventLog, read_events

# Saves the process is about to exit after: they are written before the save call returns.
_SYNC_REASONS = ("final", "pause")


class CheckpointFailed(RuntimeError):
    """A save failed and `checkpoint.on_failure=stop`: the run ends here, as a failure."""


def hot_root(run_dir: Path, cfg: CheckpointConfig, node: str | None = None) -> Path:
    """The hot tier's directory for a run; on a node-local tier (`%n`), `node`'s (default: this
    machine's host name)."""
    if not cfg.hot_dir:
        return RunDir(run_dir).checkpoints
    hot_dir = nodes.expand(cfg.hot_dir, node or socket.gethostname())
    return Path(hot_dir) / run_dir.parent.name / run_dir.name


def cold_url(run_dir: Path, cfg: CheckpointConfig) -> str:
    return f"{cfg.cold.url.rstrip('/')}/{run_dir.parent.name}/{run_dir.name}"


class Checkpointer:
    def __init__(self, run_dir: Path, cfg: CheckpointConfig, cluster: ClusterConfig, comm: RunCollectives,
                 events: EventLog) -> None:
        self.root = hot_root(run_dir, cfg, comm.node)
        self.cfg = cfg
        self.cluster = cluster
        self.comm = comm
        self.events = events
        # Every rank's node, for a node-local tier's commit of each node's directory and its buddy
        # copies (the all-gather is collective: every rank builds its checkpointer alike).
        local_tiers = nodes.node_local(cfg.hot_dir), cfg.memory.every_steps > 0
        everyone = nodes.Spread(tuple(comm.all_gather_object(comm.node))) if any(local_tiers) else None
        self.spread = everyone if local_tiers[0] else None
        self.leader = comm.rank == 0 if self.spread is None else self.spread.is_leader(comm.rank)
        # Every checkpoint collective runs on this group, from whichever thread saves; buddy copies
        # and a resume's transfers send files over it too.
        own_group = cfg.async_save or self.spread is not None
        self.group = checkpoint_group(comm, cluster.collective_timeout_s) if own_group else comm
        self.saver = AsyncSaver(self.root, self.group, cfg.max_shard_bytes, cfg.io_threads, self.spread)
        self.memory = MemoryTier(run_dir, cfg, comm, everyone, events, cluster.collective_timeout_s) \
            if everyone is not None and local_tiers[1] else None
        # The cold tier is read by whoever fills a node's directory from it (every leader of a
        # node-local tier) and written by rank 0, or by every leader, each its node's files.
        self.cold = ColdTier(cold_url(run_dir, cfg), cfg.io_threads) if cfg.cold.url and self.leader else None
        self.uploader = None
        if self.cold is not None and (comm.rank == 0 or self.spread is not None):
            parts = len(self.spread.order) if self.spread else 1
            self.uploader = Uploader(self.cold, cfg.cold, events, part=comm.node if self.spread else None, parts=parts,
                                     retention=comm.rank == 0)
        self.clock = SaveClock(last_save_step=-1, last_save_time_s=time.time())
        self.committed_step = -1
        """The newest step whose checkpoint is committed (durable): what a resume would return to.
        Written by the save's thread; the loop only reads it."""
        self.ledger: list[ledger.Event[Any]] = []
        """Rank 0: every attempt's events read at resume, then this attempt's saves."""
        self.interval: Interval | None = None
        self.failure: str | None = None
        """The last failed save's reason (sticky: `on_failure=stop` acts on it at the next save point)."""
        self.copy_on_exit = True

    # --- when
    def restart_clock(self, step: int) -> None:
        """After a resume: time-based saves count from now, step-based ones from `step`."""
        self.clock = SaveClock(last_save_step=step, last_save_time_s=time.time())
        self.committed_step = step

    def step_reason(self, step: int) -> str | None:
        return step_reason(step, self.cfg)

    def memory_due(self, step: int) -> bool:
        """A save to the memory tier falls due at the end of this step (the same on every rank)."""
        return self.memory is not None and memory_due(step, self.cfg.memory.every_steps)

    def time_due(self) -> bool:
        """Only rank 0's answer counts; the loop agrees on it across ranks with the stop flag."""
        if self.cfg.young_daly:
            interval_s = self.interval.seconds if self.interval else self.cfg.min_interval_s
        else:
            interval_s = self.cfg.every_minutes * 60.0
        return time_due(time.time(), self.clock, interval_s)

    # --- saving
    def save(self, step: int, snap: Snapshot, reason: str) -> SaveResult | None:
        """Save at a step every rank reached. In the background (returns None at once) unless async
        saves are off or this is the final save or a pause; a failed save is recorded and returns None."""
        if step == self.clock.last_save_step:
            if reason in _SYNC_REASONS:
                self.saver.wait()  # this step's own save may still be in flight
            return None
        if not self.cfg.async_save or reason in _SYNC_REASONS:
            self.saver.wait()
            return self._save_now(step, snap, reason, check=True)
        # Any rank's flag counts: a sum over ranks is > 0 when one raised it.
        busy, failed = self.comm.sum_floats([float(self.saver.busy), float(self.failure is not None)])
        if failed and self.cfg.on_failure == "stop":
            raise CheckpointFailed(f"a save failed and checkpoint.on_failure=stop: {self.failure or 'on another rank'}")
        if busy:
            if self.cfg.if_busy == "skip":
                if self.comm.rank == 0:
                    self.events.emit(ledger.SaveSkipped(reason=reason, why="the previous save is still being written"),
                                     step)
                return None
            self.saver.wait()
        self.clock = SaveClock(last_save_step=step, last_save_time_s=time.time())
        has_optimizer = bool(snap.optimizer)
        self.saver.save(step, snap, lambda result, error, blocking_s: self._finished(
            step, reason, result, error, mode="async", blocking_s=blocking_s, has_optimizer=has_optimizer))
        return None

    def save_memory(self, step: int, snap: Snapshot) -> float:
        """Save to the memory tier (every rank, at a step `memory_due` names): returns once the
        files are planned; the seconds the loop was held up (`memory.MemoryTier.save`)."""
        assert self.memory is not None, "checkpoint.memory.every_steps is 0"
        return self.memory.save(step, snap)

    def emergency_save(self, step: int, snap: Snapshot, signal_name: str | None,
                       received_at: float | None) -> SaveResult | None:
        """The save before a stop: the most of the state that fits before the kill (`deadline.py`)."""
        if step == self.clock.last_save_step:  # this step is saved (or being saved) already
            self.saver.wait()
            return None
        heard = [(t, n) for n, t in self.comm.all_gather_object((signal_name, received_at)) if n and t]
        first_at, signal = min(heard) if heard else (None, None)
        plan = self._plan(snap, signal, first_at) if self.comm.rank == 0 else None
        plan = self.comm.all_gather_object(plan)[0]
        assert plan is not None
        if self.comm.rank == 0:
            self.events.emit(ledger.EmergencyPlan(
                signal=signal, plan=plan.name, budget_s=_round(plan.budget_s), estimate_s=plan.estimate_s,
                reason=plan.reason, save_in_flight=self.saver.busy), step)
        self.saver.wait()
        self.copy_on_exit = plan.cold_copy
        if not plan.save:
            return None
        if not plan.optimizer:
            snap = dataclasses.replace(snap, optimizer={}, groups=(), optimizer_type=None)
        return self._save_now(step, snap, "emergency", check=plan.check, plan=plan.name)

    def close(self, finished: bool = False) -> None:
        """Before the process exits, on every path: the saves in flight finish, and so do the
        cold-tier copies unless an emergency plan left them to the next start. `finished` (the run
        is done, on every rank): the memory tier's files are deleted."""
        self.saver.wait()
        if self.memory is not None:
            self.memory.close(finished)
        if self.uploader is not None:
            if not self.copy_on_exit and not self.uploader.idle():
                self.events.emit(ledger.ColdCopyDeferred(reason="no time before the kill"), self.clock.last_save_step)
            self.uploader.close(finish=self.copy_on_exit)

    # --- resume
    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None, before_step: int | None = None,
               refusal: load.Refusal | None = None) -> load.ResumeOutcome:
        """The newest checkpoint that loads, of a step before `before_step`: from the memory tier
        (own node, then buddy) when it holds one at least as new as the hot tier's newest, else
        from the disk tiers; on a node-local hot tier, from the nodes' own directories and buddy
        copies first. CheckpointRefused when `refusal` objects to it; MemoryTierTooSmall, at the
        first resume, when a node's memory cannot hold the memory tier."""
        # A save still in flight (a rollback inside the process comes a few steps after one) is the
        # newest candidate: it lands first, or the load would fall back past it to an older one.
        self.saver.wait()
        if self.memory is not None:
            self.memory.wait()
        from_memory = None
        if self.memory is not None:
            if not self.memory.checked:
                self.memory.check_fits(model, optimizer)
            self.memory.guard(optimizer)
            from_memory = self.memory.resume(model, optimizer, scheduler, before_step, refusal,
                                             not_before=self._newest_on_disk(before_step))
        if from_memory is not None and from_memory.restored is not None:
            outcome = from_memory
        elif self.spread is not None:
            outcome = SpreadResume(self.root, self.spread, self.comm, getattr(self.group, "group", None),
                                   self.cfg.io_threads).run(model, optimizer, scheduler, self.cold, before_step,
                                                            refusal)
        else:
            outcome = load.resume(self.root, self.comm, model, optimizer, scheduler, self.cfg.io_threads, self.cold,
                                  before_step, refusal)
        if from_memory is not None and outcome is not from_memory:
            outcome = load.ResumeOutcome(outcome.restored, from_memory.skipped + outcome.skipped,
                                         outcome.touched_state or from_memory.touched_state)
        restored = outcome.restored
        if restored is not None and restored.rng == "reseeded":
            self.events.emit(ledger.RngReseeded(
                why=f"the checkpoint was saved by {restored.saved_world_size} rank(s) and has no RNG "
                    f"states for rank {self.comm.rank}; seeded from (run id, step, rank)"), restored.train_state.step)
        if self.comm.rank == 0:
            self.ledger = read_events(self.events.path)
            self._copy_newest_if_missing()
            self._update_interval(outcome.restored.train_state.step if outcome.restored else 0)
        return outcome

    def collect(self, step: int) -> None:
        """A node-local tier: bring every file of step `step` to rank 0's node, which then holds
        the whole checkpoint (the finished model is exported from there)."""
        if self.spread is None or len(self.spread.order) < 2:
            return
        problems = SpreadResume(self.root, self.spread, self.comm, getattr(self.group, "group", None),
                                self.cfg.io_threads).collect(step)
        if problems and self.comm.rank == 0:
            self.events.emit(ledger.SaveFailed(reason="collect", mode="sync", error="; ".join(problems[:5])), step)

    def set_aside(self, restored: load.Restored) -> None:
        """The copy a resume loaded did not reproduce the run (a replay difference): out of the
        way, so the next resume takes the step's next copy or an older checkpoint. Memory-tier
        copies are deleted (their buddy copies hold the same committed bytes, and tmpfs is
        memory); disk copies are quarantined, as a copy that fails its CRCs is. Collective."""
        step = layout.step_dir_name(restored.train_state.step)
        in_memory = self.memory is not None and restored.path.is_relative_to(self.memory.root)
        leader = self.memory.leader if in_memory and self.memory is not None else self.leader
        if leader:
            root = restored.path.parent
            copies = [p for p in (root / nodes.BUDDY_DIR).glob(f"*/{step}") if p.is_dir()]
            for path in ([restored.path] if restored.path.is_dir() else []) + copies:
                if in_memory or path in copies:
                    store.delete(path)
                else:
                    store.quarantine(path)
        self.comm.barrier()

    # --- internals
    def _newest_on_disk(self, before_step: int | None) -> int | None:
        """The newest step committed in the hot tier (in any node's own directory), before
        `before_step`: memory checkpoints older than it are passed over. Cold copies lag the hot
        tier's, so they are not asked. Collective."""
        mine = -1
        if self.leader:
            mine = max((s for s, p in store.list_step_dirs(self.root) if (p / layout.MANIFEST).is_file()
                        and (before_step is None or s < before_step)), default=-1)
        newest = max(self.comm.all_gather_object(mine))
        return None if newest < 0 else newest

    def _save_now(self, step: int, snap: Snapshot, reason: str, check: bool,
                  plan: str | None = None) -> SaveResult | None:
        try:
            result = save(self.root, step, snap, self.group, self.cfg.max_shard_bytes, self.cfg.io_threads, check=check,
                          spread=self.spread)
        except SaveError as e:
            self._finished(step, reason, None, str(e), mode="sync", blocking_s=0.0, has_optimizer=bool(snap.optimizer))
            if self.cfg.on_failure == "stop" and reason not in ("emergency", *_SYNC_REASONS):
                raise CheckpointFailed(f"a save failed and checkpoint.on_failure=stop: {e}") from None
            return None
        self.clock = SaveClock(last_save_step=step, last_save_time_s=time.time())
        self._finished(step, reason, result, None, mode="sync", blocking_s=result.seconds,
                       has_optimizer=bool(snap.optimizer), plan=plan)
        return result

    def _finished(self, step: int, reason: str, result: SaveResult | None, error: str | None, *, mode: str,
                  blocking_s: float, has_optimizer: bool, plan: str | None = None) -> None:
        """A save ended (on the save's thread for async saves): ledger, buddy copies, retention, cold
        copy, interval."""
        if result is None:
            self.failure = error
            if self.comm.rank == 0:
                self.events.emit(ledger.SaveFailed(reason=reason, mode=mode, error=error), step)
            return
        self.committed_step = max(self.committed_step, step)
        if self.comm.rank == 0:
            self.ledger.append(self.events.emit(ledger.Save(
                reason=reason, mode=mode, path=str(result.path), bytes=result.nbytes, seconds=round(result.seconds, 4),
                blocking_s=round(blocking_s, 4), has_optimizer=has_optimizer,
                replaced_to=str(result.replaced) if result.replaced else None, plan=plan,
            ), step))
        if self.spread is not None and len(self.spread.order) > 1:
            self._copy_to_buddies(step, result)
        if self.leader:
            self._apply_retention(step)
        if self.uploader is not None:
            mine = None if self.spread is None else \
                [rel for r in self.spread.ranks_on(self.comm.node) for rel in result.by_rank[r]]
            self.uploader.request(step, result.path, mine)
        if self.comm.rank == 0:
            self._update_interval(step)

    def _copy_to_buddies(self, step: int, result: SaveResult) -> None:
        """Every node's files of the new checkpoint to its buddy node (collective, on the save's group)."""
        assert self.spread is not None
        try:
            copy = buddy.replicate(self.root, result, self.spread, self.group, getattr(self.group, "group", None))
        except Exception as e:  # noqa: BLE001 - the checkpoint stands without its copies; say so
            copy = buddy.BuddyCopy(0, 0.0, [f"{e.__class__.__name__}: {e}"])
        if self.comm.rank == 0:
            self.events.emit(ledger.BuddyCopy(bytes=copy.bytes, seconds=round(copy.seconds, 4), ok=not copy.problems,
                                              problems=copy.problems[:10]), step)

    def _apply_retention(self, step: int) -> None:
        """Rank 0, or each node's leader on a node-local tier (its own directory and buddy copies);
        rank 0 records it."""
        committed = [(s, p) for s, p in store.list_step_dirs(self.root) if (p / layout.MANIFEST).is_file()]
        pinned = (self.uploader.pinned() if self.uploader else frozenset()) | store.pinned_steps(self.root)
        try:
            infos = [CheckpointInfo(s, store.has_optimizer(p)) for s, p in committed]
            plan = plan_retention(infos, self.cfg, pinned)
            paths = dict(committed)
            for s in plan.delete:
                store.delete(paths[s])
            for s in plan.strip_optimizer:
                store.strip_optimizer(paths[s])
            if self.spread is not None:
                buddy.prune(self.root, {s for s, _ in committed} - set(plan.delete))
        except (OSError, ValueError) as e:
            self.events.emit(ledger.RetentionFailed(error=str(e)), step)
            return
        if self.comm.rank != 0:
            return
        if plan.delete or plan.strip_optimizer:
            self.events.emit(ledger.Retention(deleted=list(plan.delete), optimizer_stripped=list(plan.strip_optimizer)),
                             step)

    def _plan(self, snap: Snapshot, signal: str | None, received_at: float | None) -> EmergencyPlan:
        """Rank 0: the emergency plan from the time left and what saves have cost so far."""
        grace = grace_s(signal, self.cluster.signal, self.cluster.signal_lead_s, self.cluster.term_grace_s)
        budget = None
        if grace is not None and received_at is not None:
            budget = received_at + grace - time.time() - self.cfg.emergency_reserve_s
        costs = save_costs(self.ledger)
        write_bps = costs.write_bytes_per_s or self.cfg.prior_write_gb_per_s * 1e9
        # The whole checkpoint's bytes (the ranks write their shares at once), as the measured rate is.
        weights = sum(h.spec.nbytes for h in snap.model.values())
        full = weights + sum(h.spec.nbytes for h in snap.optimizer.values())
        inflight = 0.0
        if self.saver.busy and self.saver.started_at is not None:
            inflight = max((costs.total_s or full / write_bps) - (time.perf_counter() - self.saver.started_at), 0.0)
        cold_bps = (costs.cold_bytes_per_s or self.cfg.prior_write_gb_per_s * 1e9) if self.cold else None
        return choose_plan(budget, full, weights, write_bps, inflight, cold_bps)

    def _copy_newest_if_missing(self) -> None:
        """An emergency save may have left its cold copy to this start: catch up with the newest."""
        if self.uploader is None or self.cold is None:
            return
        committed = [(s, p) for s, p in store.list_step_dirs(self.root) if (p / layout.MANIFEST).is_file()]
        try:
            in_cold = set(self.cold.steps())
        except Exception as e:  # noqa: BLE001 - the copier will report its own failures later
            self.events.emit(ledger.ColdCopyFailed(path=self.cold.url, error=f"{e.__class__.__name__}: {e}"), None)
            return
        if committed and committed[0][0] not in in_cold:
            self.uploader.request(*committed[0])

    def _update_interval(self, step: int) -> None:
        """Rank 0, Young-Daly only: recompute the interval; a change goes to the ledger."""
        if not self.cfg.young_daly:
            return
        costs = save_costs(self.ledger)
        if costs.blocking_s is None:
            return  # the first save (after min_interval_s) measures the cost
        history = failure_history(self.ledger, time.time())
        mtbf = mtbf_s(history, self.cfg.mtbf_prior_h * 3600.0)
        new = choose_interval(costs.blocking_s, costs.total_s or 0.0, mtbf, self.cfg.min_interval_s,
                              self.cfg.max_interval_s)
        if changed(self.interval.seconds if self.interval else None, new.seconds):
            self.events.emit(ledger.CheckpointInterval(
                interval_s=round(new.seconds, 1), young_daly_s=round(new.young_daly_s, 1),
                save_cost_s=round(new.save_cost_s, 4), mtbf_h=round(new.mtbf_s / 3600.0, 3),
                failures=history.failures, exposure_h=round(history.exposure_s / 3600.0, 3),
                bounds_s=[self.cfg.min_interval_s, self.cfg.max_interval_s]), step)
        self.interval = new


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
