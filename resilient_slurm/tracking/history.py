"""What reaches the tracker's history, and when. Pure.

The problem: a tracker (wandb, MLflow) can never delete history, but a run that is killed loses
the steps after its last checkpoint and computes them again after the resume. Logging every step
as it happens would put those steps into the run twice, from two timelines, and a restarted
process's step counter would go back below steps already logged.

The choice: rows wait in a `CommitBuffer` until a checkpoint that covers them is committed (or
the run finishes), and only then are sent. The tracker therefore only ever holds history that
survives, the same timeline as `metrics.jsonl`, with steps strictly increasing across all
segments of the run. The price: the dashboard lags by up to one checkpoint interval, and the rows
of a segment that dies before its next checkpoint never reach the tracker (the report counts
them from `metrics-lost.jsonl`).

A second guard covers a resume from an older checkpoint (the newest failed to verify): the
buffer starts from the highest step the tracker already holds (`logged_through`; committed.py
says how it is known), so steps at or below it are not sent again even though they are
recomputed. Those rows then belong to the abandoned timeline; the alternative, duplicate steps,
would break every chart.

Ledger events (saves, signals, resumes, crashes) ride on the last row of the send that carries
them (counts per kind, and a table with each event's own step).

Benchmark scores (rundir/benchmarks.py) arrive long after their checkpoint's step, which the
history has passed. Each rides on a row of the send as `bench/<task>/<metric>` with `bench/step`,
the checkpoint's step, which the tracker makes their x-axis (wandb: define_metric with a step
metric), so they are shown at the checkpoint's step while the history's own steps keep increasing.
"""

from __future__ import annotations

import json
from typing import Any

from resilient_slurm.ledger import Event
from resilient_slurm.tracking.base import Table

Row = tuple[int, dict[str, Any]]
LEDGER_TABLE = "events/ledger"
_LEDGER_COLUMNS = ["time", "event", "step", "rank", "details"]
_DETAILS_MAX_CHARS = 300


class CommitBuffer:
    def __init__(self, logged_through: int) -> None:
        self.logged_through = logged_through
        """Highest step already sent: rows at or below it are never sent again."""
        self._rows: dict[int, dict[str, Any]] = {}

    def add(self, step: int, values: dict[str, Any]) -> None:
        if step > self.logged_through:
            self._rows.setdefault(step, {}).update(values)

    def backfill(self, rows: list[dict[str, Any]], through: int) -> None:
        """Rows (with their `step`) up to `through` that were never sent and are not buffered: the
        committed steps of an earlier process whose sends did not survive it."""
        for row in rows:
            if self.logged_through < row["step"] <= through and row["step"] not in self._rows:
                self._rows[row["step"]] = dict(row)

    def rewind(self, step: int) -> None:
        """Forget the rows after `step`: a rollback abandoned their timeline before any commit."""
        self._rows = {s: v for s, v in self._rows.items() if s <= step}

    def take_through(self, step: int) -> list[Row]:
        """The buffered rows up to `step`, oldest first; they count as sent from now on."""
        ready = sorted(s for s in self._rows if s <= step)
        rows = [(s, self._rows.pop(s)) for s in ready]
        if rows:
            self.logged_through = rows[-1][0]
        return rows


def resume_point(sends: list[tuple[int, int]], on_disk: int | None) -> tuple[int, int]:
    """(logged_through, ledger_offset) for a new process to continue from.

    `sends` holds (last step, ledger offset after it) for each send since the previous process
    started; `on_disk` is the highest step the tracker's own files hold, or None where they cannot
    be the judge (online). A send counts only if its last row is on disk: rows are written in
    order, and that row carries the send's ledger events.
    """
    if on_disk is None:
        return sends[-1] if sends else (0, 0)
    return on_disk, max((offset for step, offset in sends if step <= on_disk), default=0)


def attach_events(rows: list[Row], events: list[Event[Any]]) -> list[Row]:
    """`rows` with the send's events on its last row: an `events/<kind>` count per event, and one
    `events/ledger` table that keeps each event's own step. All on one row, because a segment that
    is killed keeps a prefix of its rows: the events must survive or vanish with the row that
    `resume_point` judges by, or a restart would send them twice."""
    if not rows or not events:
        return rows
    out = [(step, dict(values)) for step, values in rows]
    last = out[-1][1]
    for e in events:
        key = f"events/{e.kind.value}"
        last[key] = last.get(key, 0) + 1
    last[LEDGER_TABLE] = Table(_LEDGER_COLUMNS, [_ledger_row(e) for e in events])
    return out


BENCH_PREFIX = "bench/"
BENCH_STEP = "bench/step"


def bench_values(row: dict[str, Any]) -> dict[str, Any]:
    """A benchmarks.jsonl line as tracker values: `bench/step` and `bench/<task>/<metric>`."""
    return {BENCH_STEP: int(row["step"]), **{BENCH_PREFIX + k: v for k, v in (row.get("scores") or {}).items()}}


def attach_benchmarks(rows: list[Row], bench: list[dict[str, Any]]) -> tuple[list[Row], int]:
    """`rows` with benchmark lines on them, one line per row from the last row back (two on one
    row would overwrite each other's `bench/step`); and how many lines were placed (the rest wait
    for the next send)."""
    placed = min(len(rows), len(bench))
    if not placed:
        return rows, 0
    out = [(step, dict(values)) for step, values in rows]
    for i, line in enumerate(bench[:placed]):
        out[len(out) - placed + i][1].update(bench_values(line))
    return out, placed


def _ledger_row(e: Event[Any]) -> list[Any]:
    details = {k: v for k, v in e.record.items() if k not in ("time", "event", "step", "rank", "traceback")}
    text = json.dumps(details, default=str, sort_keys=True)
    if len(text) > _DETAILS_MAX_CHARS:
        text = text[: _DETAILS_MAX_CHARS - 3] + "..."
    return [e.time, e.record.get("event"), e.step, e.rank, text]
