"""The wandb sink: one wandb run per run directory, continued by every restart and requeue.

The run id is the run directory's (`run.json`), files go to `<run_dir>/wandb/`, and each process
resumes the same id (`resume="allow"`). Offline, each process still writes a new segment
directory `wandb/offline-run-<time>-<id>/`; `wandb sync --id <id> <run_dir>/wandb/offline-run-*`
uploads them in start-time order as one run. Steps are always passed explicitly (the training
step), because wandb's own counter restarts at 0 in every process; what is sent, and when, is
decided by `committed.CommittedHistory` (only committed steps, strictly increasing).

wandb-core writes the `.wandb` file in 32 KiB blocks and flushes only when a block is full or the
run finishes, so a SIGKILLed segment loses the tail it had not flushed yet, committed steps
included. Offline, the local files are all there is, so `on_disk` is the highest step actually in
them (read back with `wandb_files`), and the next segment re-sends what is missing above it: the
run ends up with every committed step and every event exactly once. Online, the server may hold
more than the local files, so `on_disk` is None and the mark's last send stands (a gap is
possible there, a duplicate is not).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resilient_slurm.config import Config, to_dict
from resilient_slurm.console import LOG_ONLY
from resilient_slurm.rundir import RunDir
from resilient_slurm.tracking import wandb_files
from resilient_slurm.tracking.base import DASHBOARD_KEYS, Table, run_group
from resilient_slurm.tracking.committed import MARK
from resilient_slurm.tracking.history import BENCH_PREFIX, BENCH_STEP, Row

log = logging.getLogger("resilient_slurm")
# Already in every wandb row (`_step`, `_timestamp`).
_DROPPED = ("step", "time")


class WandbSink:
    name = "wandb"

    def __init__(self, run: Any, make_table: Callable[[Table], Any],
                 on_disk: Callable[[], int | None] | None = None) -> None:
        self.run = run
        # Benchmark scores arrive after their checkpoint's step: plotted against it, not wandb's step.
        run.define_metric(BENCH_STEP)
        run.define_metric(BENCH_PREFIX + "*", step_metric=BENCH_STEP)
        self.make_table = make_table
        self.on_disk = on_disk
        """Offline: the highest step the local files hold (finish waits for what was sent)."""
        self.last_sent: int | None = None

    @classmethod
    def open(cls, cfg: Config, run_dir: Path, mode: str, meta: dict[str, Any]) -> tuple[WandbSink, int | None]:
        """The sink and the highest step its files already hold (None online: the server decides)."""
        # Each process owns its wandb-core. One inherited through WANDB_SERVICE (a parent process
        # that uses wandb) outlives a SIGKILLed segment with that segment's stream still open, and
        # the next segment of the same run id then ends up written into it (seen in testing).
        os.environ.pop("WANDB_SERVICE", None)
        import wandb

        record = {k: meta[k] for k in ("run_id", "created", "config_hash", "parent") if k in meta}
        run = wandb.init(
            id=meta["run_id"], resume="allow", mode=mode, dir=str(run_dir),  # type: ignore[arg-type]
            project=cfg.tracking.project or cfg.run.experiment, entity=cfg.tracking.entity,
            name=run_dir.name, group=run_group(cfg, meta), job_type="train",
            tags=list(cfg.tracking.tags), config={**to_dict(cfg), "run_record": record},
            # Our own loggers own stdout; wandb's console capture would wrap it. Its banner (offline
            # mode, where the files are, `wandb leet`) is said once below, in the log.
            settings=wandb.Settings(console="off", quiet=True, silent=True),
        )
        if mode == "online":
            log.info("wandb: %s", run.url)
        else:
            log.info("wandb: %s run %s in %s (upload later with wandb sync; python -m resilient_slurm.report prints "
                     "the command)", mode, run.id, run.dir, extra=LOG_ONLY)
        # Reading the segments back is cheap (about 0.1 s per 5,000 logged steps here).
        on_disk = (lambda: _highest_step_on_disk(RunDir(run_dir).wandb, meta["run_id"])) if mode == "offline" else None
        sink = cls(run, lambda t: wandb.Table(columns=list[str | int](t.columns), data=t.rows), on_disk)
        return sink, on_disk() if on_disk else None

    def send(self, rows: list[Row]) -> None:
        for step, values in rows:
            # A row at the step logged last merges into it: wandb commits a row when a later step arrives.
            self.run.log({DASHBOARD_KEYS.get(k, k): self.make_table(v) if isinstance(v, Table) else v
                          for k, v in values.items() if k not in _DROPPED}, step=step)
            self.last_sent = step

    def finish(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)
        self._wait_until_on_disk()

    def _wait_until_on_disk(self, timeout_s: float = 15.0) -> None:
        """`finish` can return before wandb-core has written the last rows (seen here); the next
        segment judges what is already logged from these files, so this process leaves only once
        they hold everything it sent."""
        if self.on_disk is None or self.last_sent is None:
            return
        deadline = time.monotonic() + timeout_s
        while (self.on_disk() or 0) < self.last_sent:
            if time.monotonic() > deadline:
                log.warning("wandb: step %d not in the offline files after %.0f s", self.last_sent, timeout_s)
                return
            time.sleep(0.05)


def _highest_step_on_disk(wandb_dir: Path, run_id: str) -> int | None:
    """None when the files cannot be read back (a format change, corruption): then the mark decides."""
    try:
        return max((row.step for seg in wandb_files.segments(wandb_dir, run_id) for row in wandb_files.history(seg)),
                   default=0)
    except Exception as e:  # noqa: BLE001 - protobuf and format errors alike
        log.warning("wandb: cannot read back %s (%s: %s); continuing from %s", wandb_dir, type(e).__name__, e, MARK)
        return None
