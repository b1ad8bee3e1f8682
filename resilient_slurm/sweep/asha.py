"""Asynchronous successive halving (ASHA, Li et al. 2020) by promotion. Pure.

Rungs are step counts `min_steps * eta**k` below `max_steps`, then `max_steps`. A new trial runs to
the first rung and pauses there (its job ends after a save). Whenever a slot is free, the highest
rung with a paused trial in the best `1/eta` of everything that rung has seen promotes it: the trial
is resumed, by a new job, to the next rung. Only when nothing can be promoted does a new trial
start. When the search ends, trials still paused at a rung were stopped early: their unused steps
are what ASHA saved.

Promotion (rather than Optuna's stop-only SuccessiveHalvingPruner) fits requeueable jobs: a paused
trial costs nothing while it waits, and resuming is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from resilient_slurm.sweep.feed import ranked


def rungs(min_steps: int, eta: int, max_steps: int) -> tuple[int, ...]:
    """The rung steps, ascending, ending at max_steps. `min_steps=0`: max_steps / eta**2."""
    first = min_steps or max(max_steps // eta**2, 1)
    out: list[int] = []
    step = first
    while step < max_steps:
        out.append(step)
        step *= eta
    return (*out, max_steps)


@dataclass(frozen=True)
class Promotion:
    trial: int
    rung: int
    """The rung it is promoted from; it runs on to rung + 1."""
    value: float


def promotion(results: Mapping[int, Mapping[int, float]], paused: Mapping[int, int], eta: int,
              direction: str, top_rung: int) -> Promotion | None:
    """The trial to promote now, if any. `results`: trial -> {rung index -> objective there};
    `paused`: trial -> the rung it waits at; `top_rung`: the index of the max_steps rung."""
    for rung in reversed(range(top_rung)):
        seen = {t: r[rung] for t, r in results.items() if rung in r}
        best = ranked(seen, direction)[: len(seen) // eta]
        for trial in best:
            if paused.get(trial) == rung:
                return Promotion(trial, rung, seen[trial])
    return None
