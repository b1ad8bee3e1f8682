"""The run's checkpointing: when to save, saving with its ledger entry, and retention afterwards."""

from __future__ import annotations

import time
from pathlib import Path

from resilient_slurm.checkpoint import store
from resilient_slurm.checkpoint.policy import SaveClock, step_reason, time_due
from resilient_slurm.checkpoint.retention import CheckpointInfo, plan_retention
from resilient_slurm.checkpoint.save import SaveError, SaveResult, save
from resilient_slurm.checkpoint.state import Snapshot
from resilient_slurm.config import CheckpointConfig
from resilient_slurm.distributed import Comm
from resilient_slurm.events import EventLog


class Checkpointer:
    def __init__(self, root: Path, cfg: CheckpointConfig, comm: Comm, events: EventLog) -> None:
        self.root = root
        self.cfg = cfg
        self.comm = comm
        self.events = events
        self.clock = SaveClock(last_save_step=-1, last_save_time_s=time.time())

    def restart_clock(self, step: int) -> None:
        """After a resume: time-based saves count from now, step-based ones from `step`."""
        self.clock = SaveClock(last_save_step=step, last_save_time_s=time.time())

    def step_reason(self, step: int) -> str | None:
        return step_reason(step, self.cfg)

    def time_due(self) -> bool:
        """Only rank 0's answer counts; the loop agrees on it across ranks with the stop flag."""
        return time_due(time.time(), self.clock, self.cfg)

    def save(self, step: int, snap: Snapshot, reason: str) -> SaveResult | None:
        """Save now; a failed save is recorded and returns None (the previous checkpoints stay)."""
        if step == self.clock.last_save_step:
            return None
        try:
            result = save(self.root, step, snap, self.comm, self.cfg.max_shard_bytes, self.cfg.io_threads)
        except SaveError as e:
            if self.comm.rank == 0:
                self.events.emit("save_failed", step, reason=reason, error=str(e))
            return None
        self.clock = SaveClock(last_save_step=step, last_save_time_s=time.time())
        if self.comm.rank == 0:
            self.events.emit(
                "save", step, reason=reason, path=str(result.path), bytes=result.nbytes,
                seconds=round(result.seconds, 4), has_optimizer=bool(snap.optimizer),
                **({"replaced_to": str(result.replaced)} if result.replaced else {}),
            )
            self._apply_retention(step)
        self.comm.barrier()
        return result

    def _apply_retention(self, step: int) -> None:
        committed = [(s, p) for s, p in store.list_step_dirs(self.root) if (p / "manifest.json").is_file()]
        try:
            infos = [CheckpointInfo(s, store.has_optimizer(p)) for s, p in committed]
            plan = plan_retention(infos, self.cfg)
            paths = dict(committed)
            for s in plan.delete:
                store.delete(paths[s])
            for s in plan.strip_optimizer:
                store.strip_optimizer(paths[s])
        except (OSError, ValueError) as e:
            self.events.emit("retention_failed", step, error=str(e))
            return
        if plan.delete or plan.strip_optimizer:
            self.events.emit("retention", step, deleted=list(plan.delete), optimizer_stripped=list(plan.strip_optimizer))
