"""The hangs and stragglers of a run as the report shows them. Pure.

A hang the heartbeat monitor found names its culprits: the ranks (and nodes) the others waited for,
and the collective they waited in. A straggler names its rank, node and slowdown; where the driver
swapped its node for a spare, the throughput (tokens/s, the median of `metrics.jsonl` rows) over
the straggler's slow steps is set against the same number of steps after the swap (its first step
left out: it pays the restart's warm-up). With replica groups the swap is its group's replacement:
"after" begins when the replacement joined (`replica_join` of its group).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Event, Hang, ReplicaJoin, RestartInAllocation, Straggler, select


@dataclass(frozen=True)
class HangLine:
    step: int | None
    culprits: tuple[int, ...]
    nodes: tuple[str, ...]
    waited_s: float
    collective: str | None
    """`#57 of group 0 (default_pg)`; None when nobody waited in a collective the culprits missed."""


@dataclass(frozen=True)
class StragglerLine:
    step: int | None
    rank: int
    node: str | None
    ratio: float
    action: str
    swapped_for: tuple[str, ...] = ()
    found_to_first_step_s: float | None = None
    """The straggler found -> the first step without it (the swap's restart included)."""
    before: float | None = None
    """Median tokens/s over its slow steps."""
    after: float | None = None
    """Median tokens/s over as many steps after the swap."""


def hangs(events: list[Event[Any]]) -> list[HangLine]:
    """One line per hang the monitor found (one per hang, not per culprit)."""
    out: list[HangLine] = []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for e in select(events, Hang):
        h = e.details
        if not h.culprits:
            continue
        key = (e.time[:19], tuple(h.culprits))
        if key in seen:
            continue
        seen.add(key)
        c = h.collective
        where = None if not c else f"#{c['seq']} of group {c['group']}" + (
            f" ({c['desc']})" if c.get("desc") and c["desc"] != "undefined" else "")
        out.append(HangLine(e.step, tuple(h.culprits), tuple(h.nodes or ()), h.waited_s, where))
    return out


def stragglers(events: list[Event[Any]], rows: list[dict[str, Any]]) -> list[StragglerLine]:
    """Each straggler, with its swap's restart and the throughput around it where it was swapped."""
    swaps = [r for r in select(events, RestartInAllocation) if r.details.move == "swap"]
    joins = select(events, ReplicaJoin)
    out = []
    for e in select(events, Straggler):
        s = e.details
        found = stamp_seconds(e.time)
        swap = next((r for r in swaps if e.node in r.details.replaced and stamp_seconds(r.time) >= found), None)
        join = next((j for j in joins if j.details.group == s.group and stamp_seconds(j.time) >= found), None) \
            if s.group is not None and s.action == "swap" else None
        if (swap is None and join is None) or e.step is None:
            out.append(StragglerLine(e.step, e.rank, e.node, s.ratio, s.action))
            continue
        before = _median_tokens(rows, e.step - s.steps + 1, e.step)
        if swap is not None:
            swaps.remove(swap)
            resumed = swap.step if swap.step is not None else e.step
            took, added = swap.details.latency_s, tuple(swap.details.added)
        else:
            assert join is not None
            joins.remove(join)
            resumed = join.step if join.step is not None else e.step
            took, added = round(stamp_seconds(join.time) - found, 3), (join.node,) if join.node else ()
        after = _median_tokens(rows, resumed + 2, resumed + 1 + s.steps)
        out.append(StragglerLine(e.step, e.rank, e.node, s.ratio, s.action, added, took, before, after))
    return out


def _median_tokens(rows: list[dict[str, Any]], first: int, last: int) -> float | None:
    values = [float(r["tokens_per_s"]) for r in rows if first <= r.get("step", -1) <= last and r.get("tokens_per_s")]
    return statistics.median(values) if values else None
