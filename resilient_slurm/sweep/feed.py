"""A trial's results from its `metrics.jsonl`: the objective at each step, and what it cost. Pure.

The controller reads a trial's metrics again at every look and reports only the steps after the
last one it reported, so a requeued trial, whose resume rewrites the steps after its checkpoint
(`metrics-lost.jsonl` keeps the first copies), is never counted twice. Exact resume makes the
rewritten values equal to the first ones, so nothing is lost by keeping the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def values(rows: Iterable[Mapping[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of every row that has the metric, in step order, one per step."""
    found: dict[int, float] = {}
    for row in rows:
        value = row.get(metric)
        if isinstance(row.get("step"), int) and isinstance(value, (int, float)) and not isinstance(value, bool):
            found[row["step"]] = float(value)
    return sorted(found.items())


def unread(rows: Iterable[Mapping[str, Any]], metric: str, reported_through: int) -> list[tuple[int, float]]:
    """The values after the last reported step: what to report now."""
    return [(step, value) for step, value in values(rows, metric) if step > reported_through]


def value_at(reported: Mapping[int, float], step: int) -> float | None:
    """The objective at a step: the last value reported at or before it (an evaluation may fall
    before a pause or generation boundary)."""
    before = [s for s in reported if s <= step]
    return reported[max(before)] if before else None


def final_value(reported: Mapping[int, float]) -> float | None:
    """A finished trial's objective: its last reported value."""
    return reported[max(reported)] if reported else None


def steps_computed(kept: Sequence[Mapping[str, Any]], lost: Sequence[Mapping[str, Any]]) -> int:
    """Trial-steps the run has computed: every step of its surviving timeline and every step it
    lost to a fault and redid (a PBT member's steps before it copied a checkpoint count as its own;
    the donor's steps are the donor's)."""
    return len(kept) + len(lost)


def last_step(rows: Sequence[Mapping[str, Any]]) -> int:
    return max((row["step"] for row in rows if isinstance(row.get("step"), int)), default=0)


def better(a: float, b: float, direction: str) -> bool:
    """a is better than b."""
    return a < b if direction == "minimize" else a > b


def ranked(scores: Mapping[int, float], direction: str) -> list[int]:
    """Trial numbers, best first; ties go to the older trial."""
    sign = 1.0 if direction == "minimize" else -1.0
    return sorted(scores, key=lambda t: (sign * scores[t], t))
