"""Which checkpoints a restart can read: every committed one from the hot tier, or only those whose
cold-tier copy finished. Pure.

Mirrors `checkpoint.uploader`: one copy at a time, newest first; a commit while a copy runs
replaces the one waiting, so a slow cold tier falls behind by skipping checkpoints, never by
queueing them. A failure ends the process and its copy under way; the next attempt copies its
newest checkpoint if the cold tier lacks it (`Checkpointer._copy_newest_if_missing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KEEP = 10
"""Checkpoints remembered (the cold tier's default keep_last): the fallbacks a resume may use."""


@dataclass
class Checkpoint:
    work: float
    step: int
    cold_at: float = math.inf
    """When its cold-tier copy completes (inf: never started)."""


class Tiers:
    def __init__(self, copy_s: float) -> None:
        self.copy_s = copy_s
        self.checkpoints: list[Checkpoint] = []
        self._busy_until = 0.0
        self._waiting: Checkpoint | None = None

    def commit(self, t: float, work: float, step: int) -> None:
        self._settle(t)
        c = Checkpoint(work, step)
        self.checkpoints.append(c)
        del self.checkpoints[:-KEEP]
        self._request(t, c)

    def newest(self, t: float, cold: bool) -> Checkpoint | None:
        """The checkpoint a restart at `t` resumes from; `cold`: only copies complete by then."""
        self._settle(t)
        for c in reversed(self.checkpoints):
            if not cold or c.cold_at <= t:
                return c
        return None

    def abandon(self, t: float) -> None:
        """The process died at `t`: the copy under way and the one waiting are lost."""
        self._settle(t)
        for c in self.checkpoints:
            if c.cold_at > t:
                c.cold_at = math.inf
        self._waiting = None
        self._busy_until = t

    def resume(self, t: float) -> None:
        """A new attempt copies its newest checkpoint if the cold tier lacks it."""
        if self.checkpoints and self.checkpoints[-1].cold_at == math.inf:
            self._request(t, self.checkpoints[-1])

    def _request(self, t: float, c: Checkpoint) -> None:
        if self._busy_until <= t:
            c.cold_at = self._busy_until = t + self.copy_s
        else:
            self._waiting = c

    def _settle(self, t: float) -> None:
        """Start the waiting copy if the one before it finished by `t`."""
        if self._waiting is not None and self._busy_until <= t:
            c, self._waiting = self._waiting, None
            c.cold_at = self._busy_until = self._busy_until + self.copy_s
