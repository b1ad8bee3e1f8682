"""Which nodes a node record keeps out of new jobs. Pure.

A node's record holds one mark per verdict against it, from any job on the cluster: an Xid that
took it out, a straggler found on it, a hang it caused, a silent data corruption pinned on it
(`node_record.py`). The policy (`health.node_record_policy`) gives, per kind of mark, how many within
the window exclude the node (0: that kind never does): e.g. 2 SDCs, or 3 straggler verdicts, in 7
days. A `cleared` mark (a person repaired the node and vouched for it) forgets every mark before it.
A node stays out while its marks within the window still reach a limit, so it comes back by itself
as they age out, unless it fails again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

XID, SDC, STRAGGLER, HANG, CLEARED = "xid", "sdc", "straggler", "hang", "cleared"
KINDS = (XID, SDC, STRAGGLER, HANG, CLEARED)


@dataclass(frozen=True)
class Mark:
    """One verdict against a node (or `cleared`: the node was vouched for)."""

    node: str
    kind: str
    at: float
    """Epoch seconds."""
    job_id: str | None = None
    detail: Mapping[str, object] | None = None
    """The verdict's evidence (an Xid's number and reason, a straggler's ratio, ...)."""


def parse_limits(spec: str) -> tuple[float, dict[str, int]]:
    """`window_h=168,sdc=2,straggler=3` -> (window in seconds, limits); ValueError naming the part."""
    window_h, limits = 168.0, {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        try:
            if key == "window_h":
                window_h = float(value)
            elif key in KINDS and key != CLEARED:
                limits[key] = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"policy part {part!r}: write window_h=HOURS or KIND=COUNT with KIND one of "
                             f"{', '.join(k for k in KINDS if k != CLEARED)}") from None
    if window_h <= 0 or any(n < 0 for n in limits.values()):
        raise ValueError(f"policy {spec!r}: window_h must be > 0 and counts >= 0")
    return window_h * 3600.0, limits


def excluded(marks: Iterable[Mark], window_s: float, limits: Mapping[str, int], now: float) -> dict[str, str]:
    """The nodes the policy keeps out at `now`, each with its reason (`3 straggler in 7.0 days`)."""
    by_node: dict[str, list[Mark]] = {}
    for m in sorted(marks, key=lambda m: m.at):
        if m.kind == CLEARED:
            by_node[m.node] = []
        else:
            by_node.setdefault(m.node, []).append(m)
    out = {}
    for node, kept in sorted(by_node.items()):
        recent = [m for m in kept if now - window_s <= m.at <= now]
        over = [f"{n} {kind}" for kind, limit in limits.items()
                if limit > 0 and (n := sum(m.kind == kind for m in recent)) >= limit]
        if over:
            out[node] = f"node record: {', '.join(over)} in {window_s / 86400:.1f} days"
    return out
