"""The simulated run's ledger, shaped as `events.jsonl`, kept to the part the decisions read. Pure.

The project's decisions read the whole ledger: `recovery.decide` scans every attempt, the
Young-Daly interval counts every failure (`checkpoint.interval.failure_history`) and the save
costs are medians of recent saves (`checkpoint.costs.save_costs`). A 30-day run at scale has
hundreds of attempts and tens of thousands of saves, so handing them the whole ledger at every
decision is quadratic. This keeps what they read, exactly:

- `window`, for `recovery.decide`: the events of the newest attempt that made progress (a save
  above every step saved before it) and of every attempt after it. `failure_streak` walks the
  attempts newest first and stops at the first one that made progress, and whether an attempt
  made progress depends only on the best step saved before it, which the progress attempt's own
  save bounds from above for every later attempt; so the attempts before it never change the
  answer, and within it only its best save counts (which is why a new best save replaces the
  window). `across_progress` reads the two newest attempts' failures, so the window also keeps
  the failures of the attempt before the one that made progress (they come after its saves, so
  they are in the window when the next attempt starts). `unhealthy_nodes` reads only the newest
  attempt, which is always in the window.
- `failures` and `exposure_s`, for `mtbf_s`: what `failure_history` adds up, kept as running
  sums: an attempt that ends without a stop is a failure, and each ended attempt's exposure is
  from its `start` to its last event.
- `recent_saves`, for `save_costs`: it takes the median of the newest `RECENT` saves only (disk
  saves: a memory-tier save is progress, but the disk tier's interval is set by the disk's cost).

`full` (optional) keeps every event with its time, as the real ledger would: tests hand it to the
same decisions to show the window decides the same.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timezone
from typing import Any

from resilient_slurm.checkpoint.costs import RECENT
from resilient_slurm.checkpoint.interval import FailureHistory
from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import FAILURES, Details, Event, Save, Start

JOB_ID = "sim"
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
"""The simulated run's t = 0 (only the full ledger's timestamps use it)."""


class Ledger:
    def __init__(self, keep_full: bool = False) -> None:
        self.restart = -1
        """Attempt number: the `restart` of the attempt key (job id, restart)."""
        self.window: list[Event[Any]] = []
        self.recent_saves: deque[Event[Any]] = deque(maxlen=RECENT)
        self.failures = 0
        self.exposure_s = 0.0
        self.full: list[Event[Any]] | None = [] if keep_full else None
        self._best_before = -1
        self._best_now = -1
        self._started_s: float | None = None
        self._failed_before: list[Event[Any]] = []
        """The failures of the attempt before the newest."""

    def start(self, t: float, nodes: int) -> None:
        """A new attempt: rank 0's `start` event (before the checkpoint load, as in the job)."""
        self._failed_before = [e for e in self.window if e.restart == self.restart and e.kind in FAILURES]
        self.restart += 1
        self._best_before = max(self._best_before, self._best_now)
        self._best_now = -1
        self._started_s = t
        self.emit(t, Start(world_size=nodes, pid=0, host="simulated"), 0)

    def emit(self, t: float, details: Details, step: int | None, node: str | None = None) -> Event[Any]:
        """An event of the simulated job, as rank 0 of attempt `restart` would write it."""
        # Only the full ledger needs times (the timestamps cost more than the rest of an event).
        record = Event(details, utc_stamp(EPOCH.timestamp() + t) if self.full is not None else "", step, 0, JOB_ID, self.restart, None, node)
        self.window.append(record)
        if self.full is not None:
            self.full.append(record)
        return record

    def save(self, t: float, step: int, seconds: float, blocking_s: float, nbytes: float, memory: bool = False) -> None:
        """A committed save; a memory-tier one (`memory`) is progress for the decisions, but its
        cost is not a disk save's, so the disk tier's Young-Daly never reads it."""
        record = self.emit(t, Save(reason="time", mode="memory" if memory else "sync", path="", bytes=int(nbytes),
                                   seconds=seconds, blocking_s=blocking_s, has_optimizer=True), step)
        if not memory:
            self.recent_saves.append(record)
        if step > max(self._best_before, self._best_now):
            self.window = self._failed_before + [record]
        self._best_now = max(self._best_now, step)

    def end(self, t: float, failed: bool) -> None:
        """The attempt's last event was at `t`; it failed unless it stopped (a `stop` event)."""
        if self._started_s is None:
            return
        self.exposure_s += max(t - self._started_s, 0.0)
        self.failures += failed
        self._started_s = None

    def failure_history(self, now: float) -> FailureHistory:
        running = now - self._started_s if self._started_s is not None else 0.0
        return FailureHistory(self.failures, self.exposure_s + max(running, 0.0))


