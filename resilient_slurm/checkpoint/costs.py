"""What saves and cold-tier copies have cost in this run, from its ledger. Pure.

Input is the run's ledger events (every attempt's, so a fresh attempt plans with what the
earlier ones measured) plus this attempt's own. Medians of the most recent few, because this
kind of storage swings 2-5x from one save to the next.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger import ColdCopy, Event, Save, select

RECENT = 5


@dataclass(frozen=True)
class SaveCosts:
    write_bytes_per_s: float | None
    """Checkpoint bytes per second of wall time from the start of a save to its commit."""
    blocking_s: float | None
    """Seconds a save held up the training loop."""
    total_s: float | None
    """Seconds from the start of a save to its commit."""
    cold_bytes_per_s: float | None
    """Bytes per second of a copy to the cold tier, read-back check included."""


def save_costs(events: list[Event[Any]]) -> SaveCosts:
    saves = [e.details for e in select(events, Save) if e.details.seconds and e.details.bytes][-RECENT:]
    copies = [e.details for e in select(events, ColdCopy) if e.details.seconds and e.details.bytes][-RECENT:]
    return SaveCosts(
        write_bytes_per_s=_median([s.bytes / s.seconds for s in saves]),
        blocking_s=_median([s.seconds if s.blocking_s is None else s.blocking_s for s in saves]),
        total_s=_median([s.seconds for s in saves]),
        cold_bytes_per_s=_median([c.bytes / c.seconds for c in copies]),
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
