"""The memory tier: each node's shards in its host memory, with a copy on its buddy. Pure.

A save copies every rank's shards to its node's memory (the loop blocks for the device→host copy
only) and then to the buddy's memory; it is committed when both hold it, and one save at most is
in flight (a failure loses the one in flight). The buddy of the node at rank position i is the
node at i + 1 (a ring over the nodes in use when the save was taken).

A restart inside the allocation reads the newest committed save: each node from its own memory,
a node that left the run (failed, or out for a reset) from its buddy's. When a node and its buddy
have both lost their memory since that save, the save cannot be put together and the restart reads
the disk tiers, as without this tier. The tier belongs to the allocation: a requeue empties it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from resilient_slurm.checkpoint.interval import choose_interval
from resilient_slurm.checkpoint.policy import SaveClock, next_due_s


@dataclass
class MemorySave:
    work: float
    step: int
    ring: tuple[str, ...]
    """The nodes in use, in rank order, when it was taken."""
    lost: set[str] = field(default_factory=set)
    """Nodes of the ring whose memory is gone (or out of the run) since."""

    def complete(self) -> bool:
        """Every node's shards are on it or on its buddy."""
        if not self.lost:
            return True
        n = len(self.ring)
        return not any(node in self.lost and self.ring[(i + 1) % n] in self.lost for i, node in enumerate(self.ring))


class MemoryTier:
    """Its saves (when the next is due, the one in flight) and the newest committed one.

    The interval: every `every_s` seconds of steps, or (0) `checkpoint.interval.choose_interval`
    of the tier's own blocking and save time and the run's MTBF, at least one step; chosen again
    at every start, as the disk tier's is."""

    def __init__(self, every_s: float, blocking_s: float, save_s: float, step_s: float, max_s: float) -> None:
        self.every_s, self.blocking_s, self.save_s, self.step_s, self.max_s = every_s, blocking_s, save_s, step_s, max_s
        self.newest: MemorySave | None = None
        self.pending: tuple[float, MemorySave] | None = None
        """The save in flight: (committed at, save)."""
        self.clock = SaveClock(0, 0.0)
        self.interval_s = every_s or step_s
        self.due_at = math.inf
        self.intervals: list[float] = []
        self.saves = 0

    def resume(self, t: float, step: int, mtbf_s: float) -> None:
        """A new attempt starts at `t`: the interval for the MTBF seen so far, the next save."""
        self.clock = SaveClock(step, t)
        if not self.every_s:
            self.interval_s = choose_interval(self.blocking_s, self.save_s, mtbf_s, self.step_s, self.max_s).seconds
            self.intervals.append(self.interval_s)
        self._schedule()

    def busy_until(self, t: float, blocked_until: float) -> float | None:
        """When a save due at `t` may start, if not now: after a save blocking the loop, or after
        the one in flight (one at a time)."""
        later = max(blocked_until, self.pending[0] if self.pending else t)
        return later if later > t else None

    def take(self, t: float, work: float, step: int, ring: tuple[str, ...]) -> float:
        """Start a save at `t`; returns until when it blocks the loop."""
        self.pending = (t + self.save_s, MemorySave(work, step, ring))
        self.clock = SaveClock(step, t)
        self._schedule()
        return t + self.blocking_s

    def _schedule(self) -> None:
        self.due_at = next_due_s(self.clock, self.interval_s) or math.inf

    def commit(self) -> MemorySave:
        assert self.pending is not None
        _, self.newest = self.pending
        self.pending = None
        self.saves += 1
        return self.newest

    def lose(self, nodes: set[str]) -> None:
        """These nodes' memory is gone or out of the run; the save in flight dies with the step."""
        self.pending = None
        if self.newest is not None:
            self.newest.lost |= nodes & set(self.newest.ring)

    def usable(self) -> MemorySave | None:
        return self.newest if self.newest is not None and self.newest.complete() else None

    def clear(self) -> None:
        self.newest, self.pending = None, None
        self.due_at = math.inf
