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
    due = next_due_s(clock, interval_s)
    return due is not None and now_s >= due


def next_due_s(clock: SaveClock, interval_s: float) -> float | None:
    """The moment the time-based policy fires next (None: off). A simulation schedules its saves
    here, so it follows the same rule as `time_due`."""
    return clock.last_save_time_s + interval_s if interval_s > 0 else None


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
