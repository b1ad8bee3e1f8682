"""Which checkpoints a restart can read: the newest in the hot tier, or the newest whose cold-tier
copy finished. Pure.

Mirrors `checkpoint.uploader`: one copy at a time, newest first; a commit while a copy runs
replaces the one waiting, so a slow cold tier falls behind by skipping checkpoints, never by
queueing them. A failure ends the process and its copy under way; the next attempt copies its
newest checkpoint if the cold tier lacks it (`Checkpointer._copy_newest_if_missing`). Each tier
keeps its own newest few (`checkpoint.keep_last`, `checkpoint.cold.keep_last`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resilient_slurm.config import CheckpointConfig, ColdTierConfig

HOT_KEEP = CheckpointConfig.keep_last
COLD_KEEP = ColdTierConfig.keep_last


@dataclass
class Checkpoint:
    work: float
    step: int
    cold_at: float = math.inf
    """When its cold-tier copy completes (inf: not copied)."""


class Tiers:
    def __init__(self, copy_s: float) -> None:
        self.copy_s = copy_s
        self.hot: list[Checkpoint] = []
        self.cold: list[Checkpoint] = []
        """Copies started, oldest first; one still running has cold_at in the future."""
        self._busy_until = 0.0
        self._waiting: Checkpoint | None = None

    def commit(self, t: float, work: float, step: int) -> None:
        self._settle(t)
        c = Checkpoint(work, step)
        self.hot.append(c)
        del self.hot[:-HOT_KEEP]
        self._request(t, c)

    def newest(self, t: float, cold: bool) -> Checkpoint | None:
        """The checkpoint a restart at `t` resumes from; `cold`: only copies complete by then."""
        self._settle(t)
        if not cold:
            return self.hot[-1] if self.hot else None
        done = [c for c in self.cold if c.cold_at <= t]
        return done[-1] if done else None

    def abandon(self, t: float) -> None:
        """The process died at `t`: the copy under way and the one waiting are lost."""
        self._settle(t)
        self.cold = [c for c in self.cold if c.cold_at <= t]
        for c in self.hot:
            if c.cold_at > t:
                c.cold_at = math.inf
        self._waiting = None
        self._busy_until = t

    def resume(self, t: float) -> None:
        """A new attempt copies its newest checkpoint if the cold tier lacks it."""
        if self.hot and self.hot[-1].cold_at == math.inf:
            self._request(t, self.hot[-1])

    def _request(self, t: float, c: Checkpoint) -> None:
        if self._busy_until <= t:
            self._copy(t, c)
        else:
            self._waiting = c

    def _settle(self, t: float) -> None:
        """Start the waiting copy if the one before it finished by `t`."""
        if self._waiting is not None and self._busy_until <= t:
            c, self._waiting = self._waiting, None
            self._copy(self._busy_until, c)

    def _copy(self, start: float, c: Checkpoint) -> None:
        c.cold_at = self._busy_until = start + self.copy_s
        self.cold.append(c)
        del self.cold[:-COLD_KEEP]
