"""When to save: composable policies (every N steps, exponential, every T minutes). Pure.

Every configured policy is consulted and the first that fires names the reason, so "hybrid" is
simply several of them at once: milestones every N steps plus a save every T minutes (T fixed, or
set by Young-Daly from measured costs: `interval.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.config import CheckpointConfig


@dataclass(frozen=True)
class SaveClock:
    last_save_step: int
    last_save_time_s: float
    """Monotonic-ish wall time of the last save (or of the start/resume)."""


def step_reason(step: int, cfg: CheckpointConfig) -> str | None:
    """The step-based policy that wants a save after `step` completed steps, if any."""
    if cfg.every_steps and step % cfg.every_steps == 0:
        return "periodic"
    e = cfg.exponential_first_step
    if e and step >= e and step % e == 0 and _is_power_of_two(step // e):
        return "exponential"
    return None


def time_due(now_s: float, clock: SaveClock, interval_s: float) -> bool:
    """The time-based policy: due when `interval_s` have passed since the last save (0 = off).

    The interval is `every_minutes`, or the Young-Daly one (`interval.py`)."""
    return interval_s > 0 and now_s - clock.last_save_time_s >= interval_s


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
