"""Replica groups: which ranks make each group, what each live group computes of a step, who speaks
for the run, and when going on without a group is refused. [pure]

With `cluster.replica_ft` every HSDP replica group is a process group of its own (its own store and
port), sharded inside over dp_shard (and TP); a failure inside it breaks only it. Global rank
`g * group_size + r` is rank `r` of group `g` (with pp == 1, the layout's own order). A step's
global batch is cut by data-parallel rank as always (`Layout.dp_rank`: group g's shard s reads the
rows of data-parallel rank `g * dp_shard + s`); while groups are missing, each live group's shard s
also computes the missing groups' shard-s micro-batches, so the batch, and the sum the gradients
are, stay those of the whole run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass


def place_of(rank: int, groups: int, group_size: int) -> tuple[int, int]:
    """(group, rank inside it) of a global rank."""
    if not 0 <= rank < groups * group_size:
        raise ValueError(f"rank {rank} is outside {groups} group(s) of {group_size}")
    return divmod(rank, group_size)


@dataclass(frozen=True)
class Work:
    """One micro-batch a live group computes: micro-batch `micro` of the rows of group `source`
    (its own, or a missing group's)."""

    source: int
    micro: int


def share(live: Collection[int], groups: int, accumulation: int) -> dict[int, list[Work]]:
    """What each live group computes of a step: its own `accumulation` micro-batches, then the
    missing groups' micro-batches dealt round-robin over the live groups, lowest group first (every
    rank derives the same deal from the quorum alone). Raises ValueError without a live group."""
    alive = sorted(set(live))
    if not alive or not all(0 <= g < groups for g in alive):
        raise ValueError(f"live groups {alive} of {groups}: none live, or one out of range")
    out = {g: [Work(g, m) for m in range(accumulation)] for g in alive}
    missing = [Work(g, m) for g in range(groups) if g not in out for m in range(accumulation)]
    for i, work in enumerate(missing):
        out[alive[i % len(alive)]].append(work)
    return out


def leader(live: Iterable[int]) -> int:
    """The live group whose rank 0 writes the run's step records (metrics, saves): the lowest."""
    return min(live)


@dataclass(frozen=True)
class Change:
    """How the live groups changed from one quorum to the next."""

    left: tuple[int, ...]
    joined: tuple[int, ...]


def change(before: Collection[int], after: Collection[int]) -> Change:
    return Change(tuple(sorted(set(before) - set(after))), tuple(sorted(set(after) - set(before))))


def refusal(groups: int, failed: Collection[int], joining: Collection[int], replica_min: int) -> str | None:
    """Why the run cannot go on without the groups in `failed` (the groups whose processes just
    failed), while the groups in `joining` are still healing; None: the others go on. One line."""
    live = set(range(groups)) - set(failed) - set(joining)
    if set(failed) >= set(range(groups)):
        return f"the failure took every replica group at once ({groups} of {groups})"
    if not live:
        return (f"no live replica group: group(s) {', '.join(map(str, sorted(joining)))} were still healing when the "
                f"others failed")
    if len(live) < replica_min:
        return f"{len(live)} live replica group(s), fewer than cluster.replica_min={replica_min}"
    return None


def heal_refusal(live: Collection[int], me: int) -> str | None:
    """A replacement group's first quorum must hold a group to heal from: alone, it would start the
    run over from its initial weights. One line, or None."""
    if set(live) - {me}:
        return None
    return f"replica group {me} has no live group to heal from (the quorum holds it alone)"
