"""A hot tier on each node's own disk: which node each rank writes to, its buddy, and who sends
which bytes to whom. Pure.

`checkpoint.hot_dir` with `%n` in it is node-local: `%n` becomes the node's name, and each rank
writes its files into its own node's directory, which the node's **leader** (its lowest rank)
creates and commits. One checkpoint is then spread over the nodes that wrote it, and a node that
dies takes its part along, so every node's files are also copied to its **buddy**: each rank sends
its files to the rank with the same local index on the next node (the nodes in rank order, the
last one's buddy the first), which keeps them under `<its hot dir>/.buddy/<node>/step_N/`.

Files move between ranks over the network as **transfers**: byte ranges of one file from a rank
that holds it to a rank that wants it, cut into messages of at most `chunk` bytes and grouped in
rounds of bounded size, so neither side holds more than one round in memory. Every rank computes
the same plan from the same inputs, so no rank has to tell another what it will send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NODE_TOKEN = "%n"
BUDDY_DIR = ".buddy"


def node_local(hot_dir: str) -> bool:
    return NODE_TOKEN in hot_dir


def expand(hot_dir: str, node: str) -> str:
    return hot_dir.replace(NODE_TOKEN, node)


@dataclass(frozen=True)
class Spread:
    """The node of every rank, by rank."""

    nodes: tuple[str, ...]

    @property
    def order(self) -> tuple[str, ...]:
        """The nodes, in the order of their first rank."""
        return tuple(dict.fromkeys(self.nodes))

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return tuple(r for r, n in enumerate(self.nodes) if n == node)

    def leader(self, node: str) -> int:
        return self.ranks_on(node)[0]

    def is_leader(self, rank: int) -> bool:
        return self.leader(self.nodes[rank]) == rank

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(self.leader(n) for n in self.order)

    def buddy(self, rank: int) -> int | None:
        """The rank that keeps a copy of `rank`'s files: the same local index on the next node
        (its last rank when it has fewer); None on a single node."""
        order = self.order
        if len(order) < 2:
            return None
        node = self.nodes[rank]
        index = self.ranks_on(node).index(rank)
        nxt = self.ranks_on(order[(order.index(node) + 1) % len(order)])
        return nxt[min(index, len(nxt) - 1)]


@dataclass(frozen=True)
class Transfer:
    """Bytes [offset, offset + length) of file `rel` (of `size` bytes), from rank `src` to `dst`."""

    src: int
    dst: int
    rel: str
    offset: int
    length: int
    size: int


def cut(src: int, dst: int, rel: str, size: int, chunk: int) -> list[Transfer]:
    """One file as messages of at most `chunk` bytes (an empty file is one empty message)."""
    return [Transfer(src, dst, rel, off, min(chunk, size - off), size) for off in range(0, size, chunk)] or \
        [Transfer(src, dst, rel, 0, 0, 0)]


def plan_fetch(holders: Mapping[str, Sequence[int]], wants: Mapping[int, Sequence[str]], sizes: Mapping[str, int],
               chunk: int) -> list[Transfer]:
    """Every file each rank wants, from one of the ranks that hold it: the one sending the fewest
    bytes so far (ties to the lowest rank), so that the sending is spread over the holders.
    Raises KeyError for a wanted file nobody holds."""
    sent: dict[int, int] = {}
    plan: list[Transfer] = []
    for dst in sorted(wants):
        for rel in sorted(set(wants[dst])):
            src = min(holders[rel], key=lambda r: (sent.get(r, 0), r))
            sent[src] = sent.get(src, 0) + sizes[rel]
            plan += cut(src, dst, rel, sizes[rel], chunk)
    return plan


def rounds(plan: Sequence[Transfer], round_bytes: int) -> list[list[Transfer]]:
    """The plan in consecutive rounds of at most `round_bytes` (one larger message alone)."""
    out: list[list[Transfer]] = []
    current: list[Transfer] = []
    total = 0
    for t in plan:
        if current and total + t.length > round_bytes:
            out.append(current)
            current, total = [], 0
        current.append(t)
        total += t.length
    if current:
        out.append(current)
    return out
