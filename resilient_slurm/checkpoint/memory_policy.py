"""The memory tier's decisions: when it saves, how much host memory it needs on each node and
whether that fits, and the name of the place a resume loaded from. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from resilient_slurm.checkpoint.nodes import Spread

SOURCES = {"hot": "memory", "peers": "memory", "buddy": "buddy"}
"""A resume from the memory tier (`spread.SpreadResume` on its root) as the ledger names it: every
file in the nodes' own memory (also when some came over the network from another node's own
copy), or some from a buddy node's copy of a node that lost its own."""


def memory_due(step: int, every_steps: int) -> bool:
    return every_steps > 0 and step % every_steps == 0


def node_need(shares: Sequence[int], spread: Spread, keep_last: int) -> dict[str, int]:
    """Bytes of host memory each node's tier holds at most: `keep_last` committed checkpoints plus
    the one being written, each of the node's own ranks' shares and of the shares it keeps buddy
    copies of. `shares`: each rank's bytes, by rank."""
    need = dict.fromkeys(spread.order, 0)
    for rank, share in enumerate(shares):
        need[spread.nodes[rank]] += share
        buddy = spread.buddy(rank)
        if buddy is not None:
            need[spread.nodes[buddy]] += share
    return {node: (keep_last + 1) * n for node, n in need.items()}


def fits(node: str, need: int, free: int, available: int, where: str) -> str | None:
    """One line naming the keys and the sizes when the tier does not fit the node; `free`: bytes
    free on `where`'s filesystem, `available`: the node's MemAvailable (both counting what this
    run's tier holds already, which it reuses)."""
    if need <= min(free, available):
        return None
    return (f"checkpoint.memory.every_steps: node {node} needs {_gb(need)} of host memory for the memory tier but "
            f"checkpoint.memory.dir={where} has {_gb(free)} free and MemAvailable is {_gb(available)}; set "
            f"checkpoint.memory.every_steps=0, point checkpoint.memory.dir at a larger tmpfs, or remove old runs' "
            f"tiers (python -m resilient_slurm.checkpoint.memory_files clean DIR)")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
