import math

import pytest

from resilient_slurm.checkpoint.costs import save_costs
from resilient_slurm.checkpoint.interval import (
    FailureHistory,
    changed,
    choose_interval,
    failure_history,
    mtbf_s,
    young_daly_s,
)
from resilient_slurm.ledger import parse

H = 3600.0
T0 = 1_800_000_000.0  # epoch seconds of the first event


def ev(event, at_s, rank=0, **kw):
    from datetime import datetime, timezone

    stamp = datetime.fromtimestamp(T0 + at_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return parse({"time": stamp, "event": event, "step": 0, "rank": rank, **kw})


@pytest.mark.parametrize(
    "events, now_s, failures, exposure_s",
    [
        ([], 100.0, 0, 0.0),
        ([ev("start", 0)], 50.0, 0, 50.0),  # the attempt in progress counts its time, not a failure
        # finished, or stopped on a signal (saved first): not failures
        ([ev("start", 0), ev("stop", 100), ev("start", 200), ev("finish", 300)], 400.0, 0, 200.0),
        # a crash, and an attempt that ended without a trace (killed, node lost)
        ([ev("start", 0), ev("crash", 10, rank=1), ev("start", 20), ev("save", 50), ev("start", 60)], 70.0, 2, 50.0),
        # only rank 0's start opens an attempt; the launcher's rank -1 events belong to it
        ([ev("start", 0), ev("start", 1, rank=1), ev("rank_exit", 5, rank=-1), ev("start", 10)], 10.0, 1, 5.0),
    ],
)
def test_failure_history_from_the_ledger(events, now_s, failures, exposure_s):
    h = failure_history(events, T0 + now_s)
    assert h.failures == failures and h.exposure_s == pytest.approx(exposure_s, abs=1e-3)


@pytest.mark.parametrize(
    "history, mtbf_h",
    [(FailureHistory(0, 0.0), 24.0), (FailureHistory(0, 24 * H), 48.0), (FailureHistory(3, 8 * H), 8.0)],
)
def test_mtbf_counts_the_prior_as_one_failure(history, mtbf_h):
    assert mtbf_s(history, prior_mtbf_s=24 * H) == pytest.approx(mtbf_h * H)


def test_young_daly():
    assert young_daly_s(2.0, 10_000.0) == pytest.approx(200.0)
    assert young_daly_s(0.5, 24 * H) == pytest.approx(math.sqrt(2 * 0.5 * 24 * H))


@pytest.mark.parametrize(
    "cost_s, total_s, mtbf, expected",
    [
        (2.0, 10.0, 10_000.0, 200.0),  # inside the bounds: Young-Daly
        (0.01, 1.0, 100.0, 60.0),  # below the minimum
        (100.0, 120.0, 1e6, 3600.0),  # above the maximum
        (0.01, 90.0, 100.0, 90.0),  # never shorter than a save takes (one in flight at most)
    ],
)
def test_interval_is_bounded(cost_s, total_s, mtbf, expected):
    assert choose_interval(cost_s, total_s, mtbf, min_s=60.0, max_s=3600.0).seconds == pytest.approx(expected)


@pytest.mark.parametrize("old, new, result", [(None, 5.0, True), (100.0, 109.0, False), (100.0, 111.0, True),
                                              (100.0, 89.0, True)])
def test_only_real_changes_are_worth_an_entry(old, new, result):
    assert changed(old, new) is result


def test_save_costs_are_medians_of_the_recent_saves_and_copies():
    events = [parse({"event": "save", "bytes": 100, "seconds": s, "blocking_s": s / 10}) for s in (1, 2, 3, 100, 100, 100, 5)]
    events += [parse({"event": "save_failed"}), parse({"event": "cold_copy", "bytes": 100, "seconds": 4})]
    costs = save_costs(events)
    assert costs.total_s == 100 and costs.blocking_s == 10  # the last five: 3, 100, 100, 100, 5
    assert costs.write_bytes_per_s == 1.0 and costs.cold_bytes_per_s == 25.0
    assert save_costs([]).write_bytes_per_s is None
    # saves recorded before blocking_s existed count as fully blocking
    assert save_costs([parse({"event": "save", "bytes": 10, "seconds": 2})]).blocking_s == 2
