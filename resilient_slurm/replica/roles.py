"""Which ranks hold the copies of a shard, and which rank gives an opinion on another's. Pure.

The replicas of a shard are the ranks that differ only in their HSDP replica coordinate; the
shard is named by its replica 0's rank. A re-run belongs on another node than the copies in
dispute, where the job has one (on the same node it is still another device).
"""

from __future__ import annotations

from collections.abc import Sequence

from resilient_slurm.config import Layout


def rank_at(lay: Layout, pp: int, dp_replicate: int, dp_shard: int, tp: int) -> int:
    """The inverse of `Layout.coords`."""
    return ((pp * lay.dp_replicate + dp_replicate) * lay.dp_shard + dp_shard) * lay.tp + tp


def replicas_of(lay: Layout, rank: int) -> list[int]:
    """The ranks holding `rank`'s shard, by replica group (`rank` among them)."""
    c = lay.coords(rank)
    return [rank_at(lay, c.pp, g, c.dp_shard, c.tp) for g in range(lay.dp_replicate)]


def shard_of(lay: Layout, rank: int) -> int:
    """The shard `rank` holds, named by the rank of its copy in replica group 0."""
    return replicas_of(lay, rank)[0]


def third_rank(nodes: Sequence[str], exclude: Sequence[int]) -> int | None:
    """The lowest rank outside `exclude` on none of their nodes; else the lowest outside `exclude`
    (another device of the same node); None when every rank is excluded."""
    theirs = {nodes[r] for r in exclude}
    others = [r for r in range(len(nodes)) if r not in exclude]
    return next((r for r in others if nodes[r] not in theirs), others[0] if others else None)


def buddy_shift(nodes: Sequence[str]) -> int:
    """How far the buddy that re-runs a rank's update sits: one node on (as many ranks as the first
    node holds: Slurm gives every node of a job the same number of tasks) when the ranks spread over
    several nodes, else the next rank. The same on every rank, so the buddies form a ring: rank +
    shift re-runs rank's update, and rank re-runs rank - shift's."""
    per_node = nodes.count(nodes[0])
    return per_node if per_node < len(nodes) else 1
