"""Detectors over the per-step signals of a run. Pure: fed one observation per step, no clock.

Each detector keeps a short window of recent values and compares the new one against a robust
statistic of that window (median and median absolute deviation), so a fixed threshold is never
the only judge: a loss of 4.0 is a spike after a plateau at 2.0, not at the start of training.
Every finding carries its evidence: the value, the statistic and the threshold it crossed.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.config import FindingKind, MonitorConfig


@dataclass(frozen=True)
class Observation:
    step: int
    loss: float
    grad_norm: float
    tokens_per_s: float
    samples_per_s: float
    rank_step_s: tuple[float, ...]
    """Each rank's wall time for this step (the loop's own measure, data wait included)."""
    data_wait_s: tuple[float, ...]
    """Each rank's time waiting for its batch."""
    gpu: dict[str, float] = field(default_factory=dict)
    """Latest NVML sample of this rank's GPU (util_pct, memory_used_frac, temperature_c,
    ecc_uncorrectable); empty without NVML."""
    rss_mb: float | None = None
    """This rank's resident host memory, on the steps it is sampled (monitor.rss_every_steps)."""


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    local: bool = False
    """Of this rank's own measurements (its GPU, its memory); the others are the same on every rank."""


class _Window:
    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def full(self, minimum: int) -> bool:
        return len(self.values) >= minimum

    def median(self) -> float:
        return statistics.median(self.values)

    def mad(self) -> float:
        m = self.median()
        return statistics.median(abs(v - m) for v in self.values)

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self.values.append(value)


class Monitor:
    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg
        self.loss = _Window(cfg.window)
        self.grad = _Window(cfg.window)
        self.tokens = _Window(cfg.window)
        self.plateau_best = math.inf
        self.plateau_since = 0
        self.low_throughput_steps = 0
        self.gpu_conditions: set[str] = set()
        self.slow: int | None = None
        self.slow_steps = 0
        self.rss: deque[tuple[int, float]] = deque(maxlen=cfg.leak_window)

    def observe(self, o: Observation) -> list[Finding]:
        findings = [f for f in (
            self._loss(o), self._plateau(o), self._grad(o), self._throughput(o), self._slow_rank(o), self._stall(o),
            self._leak(o),
        ) if f is not None] + self._gpu(o)
        # Anomalous values stay out of the windows, so they cannot raise the bar for the next one.
        anomalous = {f.kind for f in findings}
        if not anomalous & {FindingKind.LOSS_NAN, FindingKind.LOSS_SPIKE}:
            self.loss.add(o.loss)
        if FindingKind.GRAD_EXPLOSION not in anomalous:
            self.grad.add(o.grad_norm)
        self.tokens.add(o.tokens_per_s)
        return findings

    def _loss(self, o: Observation) -> Finding | None:
        c = self.cfg
        if not math.isfinite(o.loss):
            return Finding(FindingKind.LOSS_NAN, o.step, f"loss is {o.loss} at step {o.step}", {"loss": str(o.loss)})
        if not c.loss_spike_mads or not self.loss.full(c.min_history):
            return None
        median, mad = self.loss.median(), self.loss.mad()
        threshold = median + max(c.loss_spike_mads * mad, c.loss_spike_min_rise * abs(median))
        if o.loss > threshold:
            return Finding(FindingKind.LOSS_SPIKE, o.step, f"loss {o.loss:.4g} at step {o.step} is above {threshold:.4g} "
                           f"(median {median:.4g} + {c.loss_spike_mads:g} MAD)",
                           {"loss": o.loss, "median": median, "mad": mad, "threshold": threshold})
        return None

    def _plateau(self, o: Observation) -> Finding | None:
        c = self.cfg
        if not c.plateau_steps or not math.isfinite(o.loss):
            return None
        if o.loss < self.plateau_best * (1 - c.plateau_min_improvement):
            self.plateau_best, self.plateau_since = o.loss, o.step
            return None
        if o.step - self.plateau_since >= c.plateau_steps:
            since = self.plateau_since
            self.plateau_since = o.step  # report once per window, not every step
            return Finding(FindingKind.LOSS_PLATEAU, o.step, f"loss has not improved by {c.plateau_min_improvement:.1%} "
                           f"for {o.step - since} steps (best {self.plateau_best:.4g})",
                           {"best": self.plateau_best, "since_step": since, "window": c.plateau_steps})
        return None

    def _grad(self, o: Observation) -> Finding | None:
        c = self.cfg
        if o.grad_norm <= c.grad_vanish_below:
            return Finding(FindingKind.GRAD_VANISHING, o.step, f"gradient norm {o.grad_norm:.3g} at step {o.step} is zero",
                           {"grad_norm": o.grad_norm, "threshold": c.grad_vanish_below})
        over_abs = c.grad_norm_max and o.grad_norm > c.grad_norm_max
        median = self.grad.median() if self.grad.full(c.min_history) else None
        over_rel = median is not None and c.grad_norm_factor and o.grad_norm > c.grad_norm_factor * median
        if not math.isfinite(o.grad_norm) or over_abs or over_rel:
            return Finding(FindingKind.GRAD_EXPLOSION, o.step, f"gradient norm {o.grad_norm:.4g} at step {o.step} exceeds "
                           + ("any finite value" if not math.isfinite(o.grad_norm) else f"{c.grad_norm_max:g}" if over_abs
                              else f"{c.grad_norm_factor:g}x its median {median:.4g}"),
                           {"grad_norm": o.grad_norm, "median": median, "max": c.grad_norm_max,
                            "factor": c.grad_norm_factor})
        return None

    def _throughput(self, o: Observation) -> Finding | None:
        c = self.cfg
        if not c.throughput_drop_ratio or not self.tokens.full(c.min_history):
            return None
        median = self.tokens.median()
        if o.tokens_per_s < c.throughput_drop_ratio * median:
            self.low_throughput_steps += 1
        else:
            self.low_throughput_steps = 0
        if self.low_throughput_steps == c.throughput_drop_steps:
            return Finding(FindingKind.THROUGHPUT_DROP, o.step, f"tokens/s {o.tokens_per_s:.0f} below {c.throughput_drop_ratio:.0%} "
                           f"of the recent median {median:.0f} for {c.throughput_drop_steps} steps",
                           {"tokens_per_s": o.tokens_per_s, "samples_per_s": o.samples_per_s, "median": median})
        return None

    def _slow_rank(self, o: Observation) -> Finding | None:
        """Reported once a rank has been the slow one for `slow_rank_steps` steps running, not again
        while it stays slow."""
        c = self.cfg
        times = o.rank_step_s
        if not c.slow_rank_factor or len(times) < 2:
            return None
        slowest = max(range(len(times)), key=lambda r: times[r])
        others = statistics.median(t for r, t in enumerate(times) if r != slowest)
        slow = others > 0 and times[slowest] > c.slow_rank_factor * others and \
            times[slowest] - others >= c.slow_rank_min_s
        if not slow:
            self.slow, self.slow_steps = None, 0
            return None
        self.slow_steps = self.slow_steps + 1 if self.slow == slowest else 1
        self.slow = slowest
        if self.slow_steps != c.slow_rank_steps:
            return None
        return Finding(FindingKind.SLOW_RANK, o.step, f"rank {slowest} took {times[slowest]:.3f}s, "
                       f"{times[slowest] / others:.1f}x the others' {others:.3f}s, for {c.slow_rank_steps} steps",
                       {"rank": slowest, "seconds": times[slowest], "others_median": others,
                        "factor": c.slow_rank_factor, "steps": c.slow_rank_steps})

    def _stall(self, o: Observation) -> Finding | None:
        c = self.cfg
        if not c.data_stall_s or not o.data_wait_s or max(o.data_wait_s) <= c.data_stall_s:
            return None
        rank = max(range(len(o.data_wait_s)), key=lambda r: o.data_wait_s[r])
        return Finding(FindingKind.DATA_STALL, o.step, f"rank {rank} waited {o.data_wait_s[rank]:.2f}s for its batch",
                       {"rank": rank, "seconds": o.data_wait_s[rank], "threshold": c.data_stall_s})

    def _leak(self, o: Observation) -> Finding | None:
        """Resident memory rising steadily: the median of the slopes between every two samples of
        the window (Theil-Sen), so a start-up ramp or a few jumps move it little. Reported once per
        window: the window starts afresh after a finding."""
        c = self.cfg
        if o.rss_mb is None or not c.leak_mb_per_step:
            return None
        self.rss.append((o.step, o.rss_mb))
        if len(self.rss) < c.leak_window:
            return None
        points = list(self.rss)
        slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(points) for b in points[i + 1:] if b[0] > a[0]]
        slope = statistics.median(slopes) if slopes else 0.0  # no two steps in order: just rolled back
        span = points[-1][0] - points[0][0]
        if slope < c.leak_mb_per_step or slope * span < c.leak_min_growth_mb:
            return None
        self.rss.clear()
        return Finding(FindingKind.MEMORY_LEAK, o.step, f"resident memory grows {slope:.2f} MB/step over steps "
                       f"{points[0][0]}-{points[-1][0]}: {points[0][1]:.0f} -> {points[-1][1]:.0f} MB",
                       {"mb_per_step": slope, "growth_mb": points[-1][1] - points[0][1], "first_step": points[0][0],
                        "last_step": points[-1][0], "rss_mb": points[-1][1], "samples": len(points),
                        "threshold_mb_per_step": c.leak_mb_per_step}, local=True)

    def _gpu(self, o: Observation) -> list[Finding]:
        """GPU conditions from the latest NVML sample, reported when they begin, not every step."""
        c, g = self.cfg, o.gpu
        now = {
            FindingKind.GPU_UNDERUTILIZED: g.get("util_pct", 100.0) < c.gpu_util_min_pct,
            FindingKind.GPU_HOT: g.get("temperature_c", 0.0) > c.gpu_temp_max_c,
            FindingKind.GPU_MEMORY_FULL: g.get("memory_used_frac", 0.0) > c.gpu_memory_max_frac,
            FindingKind.GPU_ECC: g.get("ecc_uncorrectable", 0.0) > 0,
        }
        started = [k for k, on in now.items() if on and k not in self.gpu_conditions]
        self.gpu_conditions = {k for k, on in now.items() if on}
        limits = {FindingKind.GPU_UNDERUTILIZED: c.gpu_util_min_pct, FindingKind.GPU_HOT: c.gpu_temp_max_c,
                  FindingKind.GPU_MEMORY_FULL: c.gpu_memory_max_frac, FindingKind.GPU_ECC: 0}
        return [Finding(k, o.step, f"{k.replace('_', ' ')} at step {o.step}: {dict(g)}", {**g, "limit": limits[k]},
                        local=True) for k in started]


def hang_timeout_s(recent_step_s: list[float], cfg: MonitorConfig) -> float:
    """How long without a completed step counts as a hang: a multiple of the typical step, floored."""
    if not recent_step_s:
        return max(cfg.hang_floor_s, cfg.hang_first_step_s)
    return max(cfg.hang_floor_s, cfg.hang_factor * statistics.median(recent_step_s))
