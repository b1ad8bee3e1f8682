"""The save interval that loses the least time overall (Young-Daly), and the failure rate it needs. Pure.

Saving every T seconds at a cost of C seconds each, with failures every M seconds on average,
wastes about C/T (saving) + T/(2M) (work lost since the last save) of the run; the minimum is at
T = sqrt(2 C M) (Young 1974; Daly 2006). C is what a save costs training: with async saves, the
time the loop was blocked, not the time to durable. T never goes below a save's own duration
(at most one save is in flight) and stays within the configured bounds.

M comes from the run's ledger: each attempt starts with rank 0's `start` event; an earlier attempt
that ended without `finish` or `stop` (a crash, a kill, a lost node) was a failure, while a stop
on a signal (time limit, preemption) saved first and lost nothing. The configured prior counts as
one failure in `prior` seconds, so the estimate moves with evidence but not on one event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Event, Kind

CHANGE = 0.10
"""An interval change smaller than this fraction is not worth a ledger entry."""


@dataclass(frozen=True)
class FailureHistory:
    failures: int
    exposure_s: float
    """Seconds the run has been running, over all attempts."""


@dataclass(frozen=True)
class Interval:
    seconds: float
    young_daly_s: float
    save_cost_s: float
    mtbf_s: float


def failure_history(events: list[Event[Any]], now_s: float) -> FailureHistory:
    """Failures and running time so far; the attempt in progress runs until `now_s` (epoch seconds)."""
    attempts: list[list[Event[Any]]] = []
    for e in events:
        if e.kind is Kind.START and e.rank == 0:
            attempts.append([])
        if attempts:
            attempts[-1].append(e)
    failures = 0
    exposure = 0.0
    for i, attempt in enumerate(attempts):
        kinds = {e.kind for e in attempt}
        ended = bool(kinds & {Kind.FINISH, Kind.STOP})
        running = i == len(attempts) - 1 and not ended and Kind.CRASH not in kinds
        end = now_s if running else stamp_seconds(attempt[-1].time)
        exposure += max(end - stamp_seconds(attempt[0].time), 0.0)
        if not running and (Kind.CRASH in kinds or not ended):
            failures += 1
    return FailureHistory(failures, exposure)


def mtbf_s(history: FailureHistory, prior_mtbf_s: float) -> float:
    return (prior_mtbf_s + history.exposure_s) / (1 + history.failures)


def young_daly_s(save_cost_s: float, mtbf: float) -> float:
    return math.sqrt(2.0 * save_cost_s * mtbf)


def choose_interval(save_cost_s: float, save_total_s: float, mtbf: float, min_s: float, max_s: float) -> Interval:
    optimal = young_daly_s(save_cost_s, mtbf)
    seconds = min(max(optimal, save_total_s, min_s), max_s)
    return Interval(seconds, optimal, save_cost_s, mtbf)


def changed(old_s: float | None, new_s: float) -> bool:
    return old_s is None or abs(new_s - old_s) > CHANGE * old_s

