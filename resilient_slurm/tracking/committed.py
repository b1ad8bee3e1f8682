"""The committed-history layer: the `Tracker` the training loop holds, whatever backend records it.

Rows wait in a `history.CommitBuffer` until a checkpoint covers them (or the run finishes), and
each commit hands the newly final rows to a `Sink` (wandb, MLflow), which only translates and
writes. What is backend-neutral lives here:

- where to continue: a new process starts from `history.resume_point` of the mark file and of the
  highest step the sink's store already holds (`on_disk`; None where the store cannot be read back);
- the backfill: the first commit of a process also sends the committed rows of `metrics.jsonl`
  that never reached the store (an earlier process was killed before they were written or flushed);
- the ledger mirror: the events written since the last send ride on the send's last row, read
  from `events.jsonl` by byte offset;
- benchmark scores (benchmarks.jsonl, written by evaluations beside training) ride on the send's
  rows as `bench/...` with `bench/step`, their checkpoint's step (`history.attach_benchmarks`);
- the mark file (`history_mark.json` in the backend's folder of the run directory) lists, for each
  send of this process, its last step and the ledger offset after it, and how many benchmark lines
  were sent. It is written before the
  send, so a kill between the two can leave a gap, never a duplicate.

A send that fails turns the tracker off for the rest of the process: sending later rows would
leave a hole in the middle of the run that no restart can fill, while stopping leaves a tail that
the next process re-sends from `metrics.jsonl` (where the sink can read its store back).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

from resilient_slurm.files import atomic_write, utc_stamp
from resilient_slurm.ledger import read_new_events
from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.benchmarks import read_scores
from resilient_slurm.rundir.metrics import read_metrics
from resilient_slurm.tracking.history import CommitBuffer, Row, attach_benchmarks, attach_events, resume_point

log = logging.getLogger("resilient_slurm")
MARK = "history_mark.json"


class Sink(Protocol):
    name: str
    """The backend, for log lines ("wandb", "mlflow")."""

    def send(self, rows: list[Row]) -> None:
        """Write `rows` (step, values), oldest first, steps above every step sent before, except
        that a row may repeat the step of the previous row sent: it then adds to that row (ledger
        events seen at close). Values are numbers or `Table`s under metrics.jsonl's keys, plus
        the row's UTC `time` and `events/...` keys."""

    def finish(self, exit_code: int) -> None:
        """End this process's part of the run (and wait until what was sent is written)."""


class CommittedHistory:
    def __init__(self, sink: Sink, run_dir: Path, mark_path: Path, on_disk: int | None) -> None:
        self.sink = sink
        self.mark_path = mark_path
        self.ledger = RunDir(run_dir).events
        self.metrics = RunDir(run_dir).metrics
        self.benchmarks = RunDir(run_dir).benchmarks
        sends, self.benchmarks_sent = read_mark(mark_path)
        logged_through, self.ledger_offset = resume_point(sends, on_disk)
        self.sends = [(logged_through, self.ledger_offset)]
        self.buffer = CommitBuffer(logged_through)
        self.backfilled = False
        self.last_sent: int | None = None
        """The last step this process sent: ledger events seen at close merge into its row."""
        self.failed = False

    def log(self, step: int, values: dict[str, Any]) -> None:
        # Stamped as metrics.jsonl stamps its rows, so a sink can date each point by when its step
        # ran, not by when a checkpoint committed it.
        self.buffer.add(step, {"time": utc_stamp(), **values})

    def commit(self, step: int) -> None:
        if self.failed:
            return
        try:
            if not self.backfilled:
                self.buffer.backfill(read_metrics(self.metrics), through=step)
                self.backfilled = True
            self._send(self.buffer.take_through(step))
        except Exception as e:  # noqa: BLE001 - tracking must not stop training
            self.failed = True
            log.warning("%s: could not log steps up to %d: %s: %s; tracking is off for the rest of this attempt "
                        "(the next one sends the missing steps where it can)", self.sink.name, step, type(e).__name__, e)

    def rewind(self, step: int) -> None:
        self.buffer.rewind(step)

    def close(self, exit_code: int) -> None:
        try:
            if not self.failed:
                self._send([])
            self.sink.finish(exit_code)
        except Exception as e:  # noqa: BLE001 - tracking must not stop training
            log.warning("%s: could not finish the run: %s: %s", self.sink.name, type(e).__name__, e)

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
        self.sink.send(rows)
        self.last_sent = rows[-1][0]

    def _write_mark(self) -> None:
        atomic_write(self.mark_path, json.dumps({"sends": self.sends, "benchmarks_sent": self.benchmarks_sent}))


def read_mark(path: Path) -> tuple[list[tuple[int, int]], int]:
    """The previous process's sends, (last step, ledger offset after it) each, and the benchmark
    lines sent; none without a mark."""
    if not path.exists():
        return [], 0
    mark = json.loads(path.read_text())
    return [(s[0], s[1]) for s in mark["sends"]], int(mark.get("benchmarks_sent", 0))
