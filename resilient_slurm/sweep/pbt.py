"""Population-based training (Jaderberg et al. 2017), in synchronous generations. Pure.

Every `interval` steps each member pauses (its job ends after a save). When the whole population
has paused at a generation's step, members are ranked by the objective there; each member of the
bottom quantile copies the checkpoint of a member drawn from the top quantile (exploit) and
continues with that member's hyperparameters, each perturbed by one of the factors (x0.8 / x1.2) or,
with `resample_probability`, drawn again from the search space (explore). A choice moves to a
neighbouring value instead of being scaled. Perturbed values may leave the initial range: that is
how PBT escapes a poor one.

Generations wait for the slowest member. The asynchronous variant (Ray Tune's default) compares
against whatever scores exist; with jobs that queue for minutes, waiting keeps every comparison at
the same step and makes the decisions reproducible from the seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.sweep.feed import ranked
from resilient_slurm.sweep.space import Dimension


def generation_steps(interval: int, max_steps: int) -> tuple[int, ...]:
    """The steps members pause at, then max_steps. `interval=0`: max_steps / 4."""
    every = interval or max(max_steps // 4, 1)
    return (*range(every, max_steps, every), max_steps)


@dataclass(frozen=True)
class Exploit:
    recipient: int
    donor: int
    params: dict[str, Any]
    """The donor's hyperparameters, explored: what the recipient continues with."""
    how: dict[str, str] = field(default_factory=dict)
    """key -> perturb xF | resample | neighbour."""


def decide(scores: Mapping[int, float], params: Mapping[int, Mapping[str, Any]], dims: Sequence[Dimension],
           quantile: float, direction: str, factors: Sequence[float], resample_probability: float,
           rng: random.Random) -> list[Exploit]:
    """The exploits of one generation, from each member's score at its step and current params."""
    order = ranked(scores, direction)
    # Rounded up (6 members at 0.25: 2 each way), never more than half.
    n = min(math.ceil(len(order) * quantile), len(order) // 2)
    top, bottom = order[:n], order[len(order) - n:]
    out = []
    for recipient in sorted(bottom):
        donor = rng.choice(top)
        new, how = explore(params[donor], dims, factors, resample_probability, rng)
        out.append(Exploit(recipient, donor, new, how))
    return out


def explore(params: Mapping[str, Any], dims: Sequence[Dimension], factors: Sequence[float],
            resample_probability: float, rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
    """New values for every searched key, and how each was made."""
    new, how = dict(params), {}
    for dim in dims:
        value = params[dim.key]
        if rng.random() < resample_probability:
            new[dim.key], how[dim.key] = dim.sample(rng), "resample"
        elif dim.is_choice:
            i = dim.choices.index(value) if value in dim.choices else 0
            j = min(max(i + rng.choice((-1, 1)), 0), len(dim.choices) - 1)
            new[dim.key], how[dim.key] = dim.choices[j], "neighbour"
        else:
            factor = rng.choice(list(factors))
            scaled = value * factor
            if dim.integer:
                # A small integer scaled by 1.2 rounds back to itself: move it by one at least.
                scaled = round(scaled) if round(scaled) != value else value + (1 if factor > 1 else -1)
                scaled = max(scaled, 0)
            new[dim.key], how[dim.key] = scaled, f"perturb x{factor:g}"
    return new, how
