"""Where a job's next step runs after a node fails, without leaving its allocation. Pure.

The allocation holds `target` nodes for the step plus spare nodes. When nodes leave the step:
1. restart on the survivors plus spares (spares first, in their order): the same world size, the
   same job, no trip through the queue;
2. when the spares are not enough, shrink to the survivors plus every spare, as long as that is at
   least `min_nodes` (elastic training; `min_nodes == target` turns shrinking off);
3. otherwise requeue, leaving out every node that failed in this allocation.
A failure that took no node out (a crash the health check found no fault behind) restarts on the
same nodes. A node that is slow but alive (a straggler) is swapped for a spare at a checkpoint
(`swap_out`), and counts as failed from then on.

Nodes leave the step in two ways. A node that **failed** (its verdict took it out for good, or
the crash-loop guard pinned the failures on it) is never chosen again automatically within this
allocation: its fault may come back. It becomes usable again only once it has been returned to
service, which only a person or the node's own health check does: seen out of service after it
failed (drained, down, on the exclude list) and in service again later (`seen`). A node that is
only **out** for a repair the verdict itself prescribes (a GPU reset, `Action.RESET_GPU`) is not
failed: when it is healthy again it returns as a spare (`returned`). Either way it waits as a
spare, and spares are what a shrunk run grows back onto (`grow_back`), at a checkpoint boundary,
when the capacity regained pays for the restart.

Shared by the in-allocation driver and the simulator (`resilient_slurm.simulate`), so both take
the same decision.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace


class Move(enum.Enum):
    """How the next step is placed; the value is what `restart_in_allocation` records as its `move`."""

    IN_PLACE = "in place"
    """The same nodes again: no node was at fault, or the survivors still meet the target."""
    SPARE = "spare"
    """Spares take the places of the nodes that left."""
    SHRINK = "shrink"
    """Fewer nodes than the target, down to min_nodes."""
    GROW = "grow"
    """A shrunk run back onto nodes returned to service (the driver stops the step for it)."""
    SWAP = "swap"
    """A slow node swapped for a spare (the driver stops the step for it)."""
    REQUEUE = "requeue"


@dataclass(frozen=True)
class Allocation:
    in_use: tuple[str, ...]
    """Nodes the step runs on."""
    spares: tuple[str, ...]
    """Healthy idle nodes of the allocation, in the order they are to be used."""
    target: int
    """Nodes the run wants (cluster.nodes)."""
    min_nodes: int
    """Fewest nodes the run may continue on (cluster.elastic.min_nodes); `target` turns shrinking off."""
    failed: frozenset[str] = frozenset()
    """Nodes that failed in this allocation: never chosen again within it, unless returned to service."""
    taken_out: frozenset[str] = frozenset()
    """Failed nodes seen out of service since they failed: the ones that can be returned to it."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.target:
            raise ValueError(f"min_nodes={self.min_nodes} must be between 1 and the target of {self.target} nodes")


@dataclass(frozen=True)
class Placement:
    move: Move
    allocation: Allocation
    """The allocation after the move; for REQUEUE, the one the job leaves (its `failed` updated)."""
    added: tuple[str, ...]
    """Spares brought into the step."""
    exclude: tuple[str, ...]
    """REQUEUE: nodes the next allocation must leave out (every node that failed in this one)."""
    reason: str


def initial(nodes: Sequence[str], target: int, min_nodes: int) -> Allocation:
    """The allocation a job starts with: its first `target` nodes run the step, the rest wait as spares."""
    if len(nodes) < min_nodes:
        raise ValueError(f"the allocation has {len(nodes)} node(s), fewer than the {min_nodes} the run needs")
    return Allocation(tuple(nodes[:target]), tuple(nodes[target:]), target, min_nodes)


def after_failure(alloc: Allocation, failed: Iterable[str] = (), out: Iterable[str] = ()) -> Placement:
    """The next step's nodes after `failed` nodes failed and `out` nodes left for a repair.
    Both empty: the fault was not a node's, so the same nodes run again."""
    failed_now = frozenset(failed)
    gone = failed_now | frozenset(out)
    all_failed = alloc.failed | failed_now
    survivors = tuple(n for n in alloc.in_use if n not in gone)
    spares = tuple(n for n in alloc.spares if n not in gone and n not in all_failed)
    need = alloc.target - len(survivors)
    if need <= 0:
        kept = replace(alloc, in_use=survivors, spares=spares, failed=all_failed)
        why = "no node was at fault" if not gone else f"{len(survivors)} nodes still meet the target"
        return Placement(Move.IN_PLACE, kept, (), (), f"restart on the same nodes: {why}")
    lost = ", ".join(sorted(gone))
    if len(spares) >= need:
        added = spares[:need]
        new = replace(alloc, in_use=survivors + added, spares=spares[need:], failed=all_failed)
        return Placement(Move.SPARE, new, added, (), f"{lost} replaced by spare {', '.join(added)}")
    if len(survivors) + len(spares) >= alloc.min_nodes and alloc.min_nodes < alloc.target:
        new = replace(alloc, in_use=survivors + spares, spares=(), failed=all_failed)
        return Placement(Move.SHRINK, new, spares,
                         (), f"{lost} left and {len(spares)} spare(s) remain: continue on "
                             f"{len(new.in_use)} of {alloc.target} nodes (min_nodes {alloc.min_nodes})")
    left = replace(alloc, in_use=survivors, spares=spares, failed=all_failed)
    floor = alloc.min_nodes if alloc.min_nodes < alloc.target else alloc.target
    return Placement(Move.REQUEUE, left, (), tuple(sorted(all_failed)),
                     f"{lost} left; {len(survivors)} nodes and {len(spares)} spare(s) are fewer than the "
                     f"{floor} needed: requeue without the {len(all_failed)} node(s) that failed here")


def returned(alloc: Allocation, node: str) -> Allocation:
    """`node` is healthy again after its repair: it becomes a spare, unless it failed here."""
    if node in alloc.failed or node in alloc.in_use or node in alloc.spares:
        return alloc
    return replace(alloc, spares=alloc.spares + (node,))


def seen(alloc: Allocation, usable: Mapping[str, bool]) -> Allocation:
    """The allocation after a look at its failed nodes: `usable[node]` says whether a node takes
    work now (in service in Slurm and not on the exclude list); a node left out is unknown.

    A failed node seen unusable is taken out of service. One taken out and usable again was
    returned to service (resumed by a person or by its own health check once fixed): it is no
    longer failed and waits as a spare. A failed node never seen out of service stays failed,
    however usable it looks: nobody vouched for it (a node whose task vanished is not drained)."""
    back = tuple(sorted(n for n in alloc.failed & alloc.taken_out if usable.get(n) is True))
    out = {n for n in alloc.failed if usable.get(n) is False}
    return replace(alloc, spares=alloc.spares + back, failed=alloc.failed - set(back),
                   taken_out=(alloc.taken_out | out) - set(back))


def grow_back(alloc: Allocation, restart_s: float, mtbf_s: float) -> Placement | None:
    """At a checkpoint boundary: restart a shrunk run on more nodes, or None.

    Growing costs one restart of every node in use (`restart_s`: save, relaunch, load), while the
    next failure restarts the run anyway, and that restart takes the spares back for free. So it
    grows now only when the capacity regained until the next expected failure (`mtbf_s`) is more
    than the restart costs."""
    missing = alloc.target - len(alloc.in_use)
    usable = tuple(n for n in alloc.spares if n not in alloc.failed)[:missing]
    if not usable or len(usable) * mtbf_s <= restart_s * len(alloc.in_use):
        return None
    new = replace(alloc, in_use=alloc.in_use + usable, spares=tuple(n for n in alloc.spares if n not in usable))
    return Placement(Move.GROW, new, usable, (),
                     f"grow back to {len(new.in_use)} of {alloc.target} nodes with {', '.join(usable)}")


def swap_out(alloc: Allocation, node: str, why: str) -> Placement | None:
    """`node` (in use, and slow) swapped for the first spare, in its place, so every other node keeps
    its ranks; `node` counts as failed here (never chosen again unless returned to service). None
    without a spare to take its place."""
    usable = [n for n in alloc.spares if n not in alloc.failed]
    if node not in alloc.in_use or not usable:
        return None
    spare = usable[0]
    new = replace(alloc, in_use=tuple(spare if n == node else n for n in alloc.in_use),
                  spares=tuple(n for n in alloc.spares if n != spare), failed=alloc.failed | {node})
    return Placement(Move.SWAP, new, (spare,), (), f"{node} swapped for spare {spare}: {why}")


def keep_positions(before: Sequence[str], after: Allocation, gone: Iterable[str]) -> Allocation:
    """`after` with its nodes in the positions of `before`: each node that is gone replaced where it
    stood by one added, so every surviving node keeps its ranks (a restart inside the surviving
    processes needs that). `after` itself when the nodes differ in number."""
    gone_set, added = set(gone), [n for n in after.in_use if n not in before]
    if len(after.in_use) != len(before) or len(added) != len(gone_set & set(before)):
        return after
    spare = iter(added)
    return replace(after, in_use=tuple(next(spare) if n in gone_set else n for n in before))


def lent(alloc: Allocation, nodes: Iterable[str]) -> Allocation:
    """The allocation with `nodes` that another job holds for it (a spare top-up) as its last spares."""
    held = set(alloc.in_use) | set(alloc.spares)
    return replace(alloc, spares=alloc.spares + tuple(n for n in dict.fromkeys(nodes) if n not in held))


def without(alloc: Allocation, nodes: Iterable[str]) -> Allocation:
    """The allocation once `nodes` left it, in use or spare (lent nodes given back): fewer in use
    than the target means the next start must find them elsewhere."""
    gone = set(nodes)
    return replace(alloc, in_use=tuple(n for n in alloc.in_use if n not in gone),
                   spares=tuple(n for n in alloc.spares if n not in gone))


def replace_group(alloc: Allocation, group: Sequence[str], lost: Iterable[str]) -> tuple[Allocation, tuple[str, ...]] | None:
    """One replica group's nodes with each lost one swapped for the next spare where it stood (the
    others keep their place); the allocation after it (the lost nodes failed, the spares taken).
    None: not enough spares, and the group stays out (the other groups go on without it)."""
    gone = [n for n in dict.fromkeys(lost) if n in group]
    spares = [n for n in alloc.spares if n not in alloc.failed]
    if len(spares) < len(gone):
        return None
    swap = dict(zip(gone, spares))
    nodes = tuple(swap.get(n, n) for n in group)
    in_use = tuple(swap.get(n, n) for n in alloc.in_use)
    left = tuple(n for n in alloc.spares if n not in swap.values())
    return replace(alloc, in_use=in_use, spares=left, failed=alloc.failed | frozenset(gone)), nodes
