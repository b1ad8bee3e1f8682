"""Stragglers: a rank that is slow but alive. Pure: fed every rank's step sections, one step at a time.

A rank's compute at a step is its forward, backward and optimizer sections, without the time it
waited in collectives (`session/sections.py`): with FSDP2 every rank waits for the slowest inside
its forward and backward, so only the waits taken out leave each rank's own speed. A loop that marks
no sections gets its step time less its data and collective wait. A rank whose compute is above
`factor` times the median of the others' (and at least `min_s` slower, so that jitter on tiny steps
is no finding) on `steps` consecutive steps is a straggler; it is reported once, and again only
after it was not slow for a step.

Each finding carries its evidence: the rank's compute and the others' median on the step it was
found, the ratio, its sections averaged over its slow steps, and every rank's score: the others'
median over the rank's compute (1: as fast as the median; below 1: slower), NVRx's relative score.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

COMPUTE = ("forward", "backward", "optimizer")


def compute_s(sections: Mapping[str, float]) -> float:
    """A rank's own compute in a step, from its sections."""
    marked = sum(sections.get(k, 0.0) for k in COMPUTE)
    if marked > 0:
        return marked
    return max(sections.get("step", 0.0) - sections.get("data", 0.0) - sections.get("collective", 0.0), 0.0)


@dataclass(frozen=True)
class Straggler:
    rank: int
    step: int
    """The step it was found at: the last of its `steps` slow steps."""
    compute_s: float
    others_s: float
    """The median of the other ranks' compute at that step."""
    ratio: float
    steps: int
    sections: dict[str, float]
    """Its sections, averaged over its slow steps."""
    scores: dict[int, float]
    """Every rank's relative score at that step: the others' median over its compute."""

    def describe(self) -> str:
        return (f"rank {self.rank}'s compute took {self.compute_s:.3f}s, {self.ratio:.1f}x the others' median "
                f"{self.others_s:.3f}s, for {self.steps} steps running (to step {self.step})")


@dataclass
class StragglerDetector:
    factor: float
    steps: int
    min_s: float
    _slow: dict[int, list[Mapping[str, float]]] = field(default_factory=dict)
    """Each slow rank's sections on its current run of slow steps."""
    _reported: set[int] = field(default_factory=set)

    def observe(self, step: int, sections: Mapping[int, Mapping[str, float]]) -> list[Straggler]:
        """One step's sections of every rank; the stragglers found at it."""
        if len(sections) < 2:
            return []
        compute = {r: compute_s(s) for r, s in sections.items()}
        found = []
        for rank, mine in compute.items():
            others = statistics.median(c for r, c in compute.items() if r != rank)
            if not (others > 0 and mine > self.factor * others and mine - others >= self.min_s):
                self._slow.pop(rank, None)
                self._reported.discard(rank)
                continue
            window = self._slow[rank] = (self._slow.get(rank, []) + [sections[rank]])[-self.steps:]
            if len(window) < self.steps or rank in self._reported:
                continue
            self._reported.add(rank)
            keys = sorted({k for s in window for k in s})
            mean = {k: round(statistics.fmean(s.get(k, 0.0) for s in window), 6) for k in keys}
            scores = {r: round(statistics.median(c for q, c in compute.items() if q != r) / c, 3) if c > 0 else 1.0
                      for r, c in compute.items()}
            found.append(Straggler(rank, step, round(mine, 6), round(others, 6), round(mine / others, 3),
                                   self.steps, mean, scores))
        return found
