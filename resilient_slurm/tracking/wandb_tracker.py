"""The wandb adapter: one wandb run per run directory, continued by every restart and requeue.

The run id is the run directory's (`run.json`), files go to `<run_dir>/wandb/`, and each process
resumes the same id (`resume="allow"`). Offline, each process still writes a new segment
directory `wandb/offline-run-<time>-<id>/`; `wandb sync --id <id> <run_dir>/wandb/offline-run-*`
uploads them in start-time order as one run. Steps are always passed explicitly (the training
step), because wandb's own counter restarts at 0 in every process; what is sent, and when, is
decided by `history.CommitBuffer` (only committed steps, strictly increasing).

`history_mark.json` in the wandb directory lists, for each send of the current process, its last
step and how far the ledger was mirrored; it is written before the send, so a kill between the
two can leave a gap, never a duplicate.

wandb-core writes the `.wandb` file in 32 KiB blocks and flushes only when a block is full or the
run finishes, so a SIGKILLed segment loses the tail it had not flushed yet, committed steps
included. Offline, the local files are all there is, so a new segment continues from the highest
step actually in them (read back with `wandb_files`; `history.resume_point`), and its first send
re-sends the committed steps missing above it from `metrics.jsonl` and the ledger events that
went with them: the run ends up with every committed step and every event exactly once. Online,
the server may hold more than the local files, so the mark's last send stands (a gap is possible
there, a duplicate is not).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.benchmarks import read_scores
from resilient_slurm.rundir.metrics import read_metrics
from resilient_slurm.config import Config, to_dict
from resilient_slurm.ledger import read_new_events
from resilient_slurm.tracking import wandb_files
from resilient_slurm.tracking.base import Table
from resilient_slurm.tracking.history import (
    BENCH_PREFIX,
    BENCH_STEP,
    CommitBuffer,
    Row,
    attach_benchmarks,
    attach_events,
    resume_point,
)

log = logging.getLogger("resilient_slurm")
MARK = "history_mark.json"
# metrics.jsonl's keys as wandb shows them; keys not listed go to wandb as they are.
WANDB_KEYS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "epoch": "train/epoch",
    "tokens": "train/tokens", "tokens_per_s": "perf/tokens_per_s", "samples_per_s": "perf/samples_per_s",
    "step_seconds": "perf/step_seconds", "eval_seconds": "perf/eval_seconds", "val_loss": "val/loss",
    "exact_match": "val/exact_match", "gpu_util": "gpu/utilization", "gpu_mem_gb": "gpu/memory_gb",
    "gpu_mem_peak_gb": "gpu/memory_peak_gb",
}
# Already in every wandb row (`_step`, `_timestamp`).
_DROPPED = ("step", "time")


class WandbTracker:
    def __init__(self, run: Any, make_table: Callable[[Table], Any], run_dir: Path, logged_through: int,
                 ledger_offset: int, on_disk: Callable[[], int | None] | None = None, benchmarks_sent: int = 0) -> None:
        self.run = run
        # Benchmark scores arrive after their checkpoint's step: plotted against it, not wandb's step.
        run.define_metric(BENCH_STEP)
        run.define_metric(BENCH_PREFIX + "*", step_metric=BENCH_STEP)
        self.benchmarks = RunDir(run_dir).benchmarks
        self.benchmarks_sent = benchmarks_sent
        """Lines of benchmarks.jsonl already sent (kept in the mark: a restart sends none twice)."""
        self.on_disk = on_disk
        """Offline: the highest step the local files hold (close waits for what it sent)."""
        self.make_table = make_table
        self.mark_path = RunDir(run_dir).wandb / MARK
        self.ledger = RunDir(run_dir).events
        self.metrics = RunDir(run_dir).metrics
        self.ledger_offset = ledger_offset
        self.sends = [(logged_through, ledger_offset)]
        self.buffer = CommitBuffer(logged_through)
        self.backfilled = False
        self.last_sent: int | None = None
        """The last step this process sent: ledger events seen at close merge into its row."""

    @classmethod
    def open(cls, cfg: Config, run_dir: Path, mode: str, meta: dict[str, Any]) -> WandbTracker:
        # Each process owns its wandb-core. One inherited through WANDB_SERVICE (a parent process
        # that uses wandb) outlives a SIGKILLed segment with that segment's stream still open, and
        # the next segment of the same run id then ends up written into it (seen in testing).
        os.environ.pop("WANDB_SERVICE", None)
        import wandb

        record = {k: meta[k] for k in ("run_id", "created", "config_hash", "parent") if k in meta}
        run = wandb.init(
            id=meta["run_id"], resume="allow", mode=mode, dir=str(run_dir),  # type: ignore[arg-type]
            project=cfg.tracking.project or cfg.run.experiment, entity=cfg.tracking.entity,
            name=run_dir.name, group=meta.get("ablation", {}).get("group") or _sweep_group(cfg), job_type="train",
            tags=list(cfg.tracking.tags), config={**to_dict(cfg), "run_record": record},
            # Our own loggers own stdout; wandb's console capture would wrap it.
            settings=wandb.Settings(console="off", quiet=True),
        )
        mark_path = RunDir(run_dir).wandb / MARK
        mark = json.loads(mark_path.read_text()) if mark_path.exists() else {}
        sends = [tuple(s) for s in mark.get("sends", [])]
        # Reading the segments back is cheap (about 0.1 s per 5,000 logged steps here).
        on_disk = _highest_step_on_disk(RunDir(run_dir).wandb, meta["run_id"]) if mode == "offline" else None
        return cls(run, lambda t: wandb.Table(columns=list[str | int](t.columns), data=t.rows), run_dir,
                   *resume_point(sends, on_disk),
                   on_disk=(lambda: _highest_step_on_disk(RunDir(run_dir).wandb, meta["run_id"])) if mode == "offline" else None,
                   benchmarks_sent=int(mark.get("benchmarks_sent", 0)))

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.buffer.add(step, values)

    def commit(self, step: int) -> None:
        try:
            if not self.backfilled:
                self.buffer.backfill(read_metrics(self.metrics), through=step)
                self.backfilled = True
            self._send(self.buffer.take_through(step))
        except Exception as e:  # noqa: BLE001 - tracking must not stop training
            log.warning("wandb: could not log steps up to %d: %s: %s", step, type(e).__name__, e)

    def rewind(self, step: int) -> None:
        self.buffer.rewind(step)

    def close(self, exit_code: int) -> None:
        try:
            self._send([])
            self.run.finish(exit_code=exit_code)
            self._wait_until_on_disk()
        except Exception as e:  # noqa: BLE001 - tracking must not stop training
            log.warning("wandb: could not finish the run: %s: %s", type(e).__name__, e)

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

    def _send(self, rows: list[Row]) -> None:
        events, offset = read_new_events(self.ledger, self.ledger_offset)
        if not rows and events and self.last_sent is not None:
            rows = [(self.last_sent, {})]
        if not rows:
            return  # events without a row of this process wait for the next one
        rows = attach_events(rows, events)
        rows, placed = attach_benchmarks(rows, read_scores(self.benchmarks)[self.benchmarks_sent:])
        self.benchmarks_sent += placed
        self.ledger_offset = offset
        self.sends.append((rows[-1][0], offset))
        self._write_mark()
        for step, values in rows:
            self.run.log({WANDB_KEYS.get(k, k): self.make_table(v) if isinstance(v, Table) else v
                          for k, v in values.items() if k not in _DROPPED}, step=step)
            self.last_sent = step

    def _write_mark(self) -> None:
        tmp = self.mark_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"sends": self.sends, "benchmarks_sent": self.benchmarks_sent}))
        os.replace(tmp, self.mark_path)


def _highest_step_on_disk(wandb_dir: Path, run_id: str) -> int | None:
    """None when the files cannot be read back (a format change, corruption): then the mark decides."""
    try:
        return max((row.step for seg in wandb_files.segments(wandb_dir, run_id) for row in wandb_files.history(seg)),
                   default=0)
    except Exception as e:  # noqa: BLE001 - protobuf and format errors alike
        log.warning("wandb: cannot read back %s (%s: %s); continuing from %s", wandb_dir, type(e).__name__, e, MARK)
        return None


def _sweep_group(cfg: Config) -> str | None:
    """A search's trials are grouped by their study."""
    return f"sweep-{cfg.sweep.name}" if cfg.sweep.name else None
