"""A run's outcome in GPU-hours and dollars, and figures over seeds (mean and percentiles). Pure.

Goodput = GPU-hours of training that survived / GPU-hours paid for. The job's GPUs are paid for
the whole window (the seed's "10,000 H100s for 30 days"), and each spare node while it is held
idle: one that took a failed node's place is one of the job's GPUs from then on, and the failed
node has left the job (Slurm removes a failed node from a --no-kill job's allocation, and its
billing with it: `scontrol show job` went from `billing=2` to `billing=1` on the sandbox). The lost
GPU-hours by cause add up to the difference, exactly.

ETTR is MegaScale's effective training time ratio: iterations x iteration time / wall time, where
the iterations are those that survived (work redone after a failure counts once) and the
iteration time is the whole run's (a shrunk run's slower steps count as the full run's fraction
they did). The simulated work is exactly iterations x iteration time, so ETTR = work / window, and
1 - ETTR splits into the causes below (spares excluded: the job does not hold them). So
goodput = ETTR x (GPUs in the job / GPUs paid for): the two differ only by the spares.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.simulate.costs import CAUSES
from resilient_slurm.simulate.engine import Run, Trace
from resilient_slurm.simulate.scenario import Scenario, Strategy

PERCENTILES = (10, 50, 90)


@dataclass(frozen=True)
class Outcome:
    """One seed."""

    seed: int
    paid_gpu_h: float
    productive_gpu_h: float
    lost_gpu_h: dict[str, float]
    restarts: dict[str, int]
    interruptions: dict[str, int]
    excluded: dict[str, int]
    saves: int
    mean_interval_s: float | None
    job_gpu_h: float = 0.0
    """GPU-hours of the job's own GPUs over the window (spares excluded)."""
    paths: dict[str, int] = field(default_factory=dict)
    memory_saves: int = 0
    mean_memory_interval_s: float | None = None

    @property
    def goodput(self) -> float:
        return self.productive_gpu_h / self.paid_gpu_h

    @property
    def ettr(self) -> float:
        """Iterations x iteration time / wall time (MegaScale)."""
        return self.productive_gpu_h / self.job_gpu_h


def outcome(run: Run, seed: int) -> Outcome:
    s = run.s
    to_gpu_h = s.gpus / 3600.0
    lost = {cause: run.lost[cause] * to_gpu_h for cause in CAUSES}
    lost["spares"] = run.spare_node_s * s.gpus_per_node / 3600.0
    return Outcome(
        seed=seed,
        paid_gpu_h=s.gpus * s.horizon_s / 3600.0 + lost["spares"],
        productive_gpu_h=run.work * to_gpu_h,
        lost_gpu_h=lost,
        restarts=dict(run.restarts),
        interruptions=dict(run.interruptions),
        excluded=dict(run.excluded),
        saves=run.saves,
        mean_interval_s=statistics.fmean(run.intervals) if run.intervals else None,
        job_gpu_h=s.gpus * s.horizon_s / 3600.0,
        paths=dict(run.paths),
        memory_saves=run.memory.saves if run.memory else 0,
        mean_memory_interval_s=statistics.fmean(run.memory.intervals) if run.memory and run.memory.intervals else None,
    )


@dataclass(frozen=True)
class Summary:
    """One strategy over every seed."""

    strategy: str
    label: str
    outcomes: list[Outcome]
    scenario: Scenario
    goodput_pct: dict[int, float] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "goodput_pct", percentiles([o.goodput for o in self.outcomes]))

    @property
    def goodput(self) -> float:
        return statistics.fmean(o.goodput for o in self.outcomes)

    @property
    def ettr(self) -> float:
        return statistics.fmean(o.ettr for o in self.outcomes)

    @property
    def paid_gpu_h(self) -> float:
        """The mean over seeds: each seed holds its spares idle for as long as its failures leave them."""
        return statistics.fmean(o.paid_gpu_h for o in self.outcomes)

    @property
    def job_share(self) -> float:
        """GPUs in the job / GPUs paid for (goodput = ETTR x this)."""
        return self.outcomes[0].job_gpu_h / self.paid_gpu_h

    def lost_gpu_h(self) -> dict[str, float]:
        return {c: statistics.fmean(o.lost_gpu_h[c] for o in self.outcomes) for c in CAUSES}

    def total_lost_gpu_h(self) -> float:
        return statistics.fmean(o.paid_gpu_h - o.productive_gpu_h for o in self.outcomes)

    def mean_counts(self, attribute: str) -> dict[str, float]:
        total: Counter[str] = Counter()
        for o in self.outcomes:
            total.update(getattr(o, attribute))
        return {k: v / len(self.outcomes) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}

    def mean_interval_s(self, memory: bool = False) -> float | None:
        values = [o.mean_memory_interval_s if memory else o.mean_interval_s for o in self.outcomes]
        kept = [v for v in values if v]
        return statistics.fmean(kept) if kept else None

    def to_json(self) -> dict[str, Any]:
        s = self.scenario
        lost = self.total_lost_gpu_h()
        return {
            "strategy": self.strategy,
            "label": self.label,
            "seeds": len(self.outcomes),
            "goodput": round(self.goodput, 5),
            **{f"goodput_p{p}": round(v, 5) for p, v in self.goodput_pct.items()},
            "ettr": round(self.ettr, 5),
            "job_share": round(self.job_share, 5),
            "paid_gpu_h": round(self.paid_gpu_h, 1),
            "lost_gpu_h": round(lost, 1),
            "lost_gpu_h_by_cause": {c: round(v, 1) for c, v in self.lost_gpu_h().items()},
            "dollars": {"price_per_gpu_h": s.price, "paid": round(self.paid_gpu_h * s.price),
                        "lost": round(lost * s.price), "lost_low": round(lost * s.price_low),
                        "lost_high": round(lost * s.price_high)},
            "restarts": {k: round(v, 2) for k, v in self.mean_counts("restarts").items()},
            "interruptions": {k: round(v, 2) for k, v in self.mean_counts("interruptions").items()},
            "excluded_nodes": {k: round(v, 2) for k, v in self.mean_counts("excluded").items()},
            "restart_paths": {k: round(v, 2) for k, v in self.mean_counts("paths").items()},
            "saves": round(statistics.fmean(o.saves for o in self.outcomes), 1),
            "mean_interval_s": None if self.mean_interval_s() is None else round(self.mean_interval_s() or 0.0, 1),
            "memory_saves": round(statistics.fmean(o.memory_saves for o in self.outcomes), 1),
            "mean_memory_interval_s": None if self.mean_interval_s(memory=True) is None
            else round(self.mean_interval_s(memory=True) or 0.0, 1),
        }


def simulate(s: Scenario, strategy: Strategy, seeds: int, first_seed: int = 0,
             trace: bool = False, on_seed: Callable[[], None] = lambda: None) -> tuple[Summary, Trace | None]:
    """`seeds` runs (seeds first_seed, first_seed + 1, ...); with `trace`, the first one's timeline.
    `on_seed` is called after each run (the command's progress)."""
    outcomes, first = [], None
    for seed in range(first_seed, first_seed + seeds):
        run = Run(s, strategy, seed, trace=trace and seed == first_seed).run()
        first = run.trace if seed == first_seed else first
        outcomes.append(outcome(run, seed))
        on_seed()
    return Summary(strategy.name, strategy.label, outcomes, s), first


def percentiles(values: list[float]) -> dict[int, float]:
    """Linear interpolation between order statistics (numpy's default), for PERCENTILES."""
    ordered = sorted(values)
    out = {}
    for p in PERCENTILES:
        pos = (len(ordered) - 1) * p / 100.0
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        out[p] = ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
    return out
