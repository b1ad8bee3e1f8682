"""The pure rules of what reaches the tracker: committed steps only, each once, events attached."""

import pytest

from resilient_slurm.ledger import parse
from resilient_slurm.tracking.base import Table
from resilient_slurm.tracking.history import (
    LEDGER_TABLE,
    CommitBuffer,
    attach_events,
    resume_point,
)


@pytest.mark.parametrize(
    "logged_through, adds, commits, sent",
    [
        # rows wait for a commit, and only rows up to the committed step leave
        (0, [1, 2, 3, 4], [2], [[1, 2]]),
        (0, [1, 2, 3, 4], [2, 4], [[1, 2], [3, 4]]),
        (0, [1, 2, 3], [], []),
        # a commit with nothing new sends nothing
        (0, [1, 2], [2, 2], [[1, 2], []]),
        # after a rollback below what was sent, the recomputed steps are not sent again
        (5, [4, 5, 6, 7], [7], [[6, 7]]),
        # a commit of an earlier step (an older checkpoint) sends nothing beyond it
        (0, [1, 2, 3], [1], [[1]]),
    ],
)
def test_commit_buffer_sends_each_committed_step_once(logged_through, adds, commits, sent):
    buf = CommitBuffer(logged_through)
    for step in adds:
        buf.add(step, {"loss": float(step)})
    assert [[s for s, _ in buf.take_through(c)] for c in commits] == sent


def test_values_logged_for_one_step_merge():
    buf = CommitBuffer(0)
    buf.add(3, {"loss": 1.0})
    buf.add(3, {"val_loss": 2.0})
    assert buf.take_through(3) == [(3, {"loss": 1.0, "val_loss": 2.0})]
    assert buf.logged_through == 3


@pytest.mark.parametrize(
    "sends, on_disk, expected",
    [
        ([], None, (0, 0)),
        ([(0, 0), (25, 400), (50, 900)], None, (50, 900)),  # online: the mark decides
        ([(0, 0), (25, 400), (50, 900)], 50, (50, 900)),  # everything reached the file
        ([(0, 0), (25, 400), (50, 900)], 37, (37, 400)),  # the tail after 37 was never flushed
        ([(0, 0), (25, 400), (50, 900)], 12, (12, 0)),
        ([(40, 700), (40, 760)], 40, (40, 760)),  # events merged into row 40 at close count too
        ([], 90, (90, 0)),  # no mark: the file is the truth, events are mirrored again
    ],
)
def test_resume_point(sends, on_disk, expected):
    assert resume_point(sends, on_disk) == expected


def event(kind, step):
    return parse({"time": "2026-01-01T00:00:00.000Z", "event": kind, "step": step, "rank": 0, "path": "/x"})


@pytest.mark.parametrize(
    "steps, events, counts",
    [
        # every event of a send rides on its last row (a killed segment keeps a prefix of its rows)
        ([10, 11, 12], [event("save", 11)], {12: {"events/save": 1}}),
        ([26, 27], [event("resume", 25), event("attempt", None)], {27: {"events/resume": 1, "events/attempt": 1}}),
        ([5, 6], [event("crash", 9)], {6: {"events/crash": 1}}),
        # every rank's signal counts
        ([7], [event("signal", 7), event("signal", 7)], {7: {"events/signal": 2}}),
    ],
)
def test_events_are_attached_to_the_rows_being_sent(steps, events, counts):
    rows = attach_events([(s, {"loss": 1.0}) for s in steps], events)
    got = {s: {k: v for k, v in values.items() if k.startswith("events/") and k != LEDGER_TABLE}
           for s, values in rows}
    assert {s: c for s, c in got.items() if c} == counts
    table = rows[-1][1][LEDGER_TABLE]
    assert isinstance(table, Table) and [r[1] for r in table.rows] == [e.kind.value for e in events]
    assert table.rows[0][4] == '{"path": "/x"}'


def test_no_events_leaves_rows_alone():
    rows = [(1, {"loss": 1.0})]
    assert attach_events(rows, []) == rows and attach_events([], [event("save", 1)]) == []


def test_backfill_adds_only_missing_committed_rows():
    buf = CommitBuffer(3)
    buf.add(6, {"loss": 6.0, "table": "kept"})
    buf.backfill([{"step": s, "loss": float(s)} for s in range(1, 9)], through=7)
    rows = buf.take_through(7)
    assert [s for s, _ in rows] == [4, 5, 6, 7]
    assert rows[2][1] == {"loss": 6.0, "table": "kept"}  # what this process logged wins
    assert buf.take_through(8) == []  # step 8 was not committed when the backfill ran


def test_benchmark_lines_ride_on_distinct_rows_from_the_last_back():
    from resilient_slurm.tracking.history import attach_benchmarks

    bench = [{"step": 20, "scores": {"tiny_mmlu/acc": 0.5}}, {"step": 40, "scores": {"tiny_mmlu/acc": 0.75}}]
    rows, placed = attach_benchmarks([(41, {"loss": 1.0}), (42, {}), (43, {})], bench)
    assert placed == 2 and rows[0] == (41, {"loss": 1.0})
    assert rows[1] == (42, {"bench/step": 20, "bench/tiny_mmlu/acc": 0.5})
    assert rows[2] == (43, {"bench/step": 40, "bench/tiny_mmlu/acc": 0.75})
    rows, placed = attach_benchmarks([(50, {})], bench)  # the second waits for the next send
    assert placed == 1 and rows == [(50, {"bench/step": 20, "bench/tiny_mmlu/acc": 0.5})]
    assert attach_benchmarks([], bench) == ([], 0)
