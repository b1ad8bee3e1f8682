"""Which checkpoints to delete, and which to strip of optimizer state. Pure.

The newest `keep_last` are kept whole-or-weights as below, milestones are kept forever, and no
plan ever leaves fewer than two checkpoints: the newest may be the one being written when a
node dies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Rules(Protocol):
    """A tier's retention settings (`CheckpointConfig` for the hot tier, `ColdTierConfig` for the cold)."""

    keep_last: int
    keep_every_steps: int
    optimizer_on_last: int


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    has_optimizer: bool


@dataclass(frozen=True)
class RetentionPlan:
    delete: tuple[int, ...]
    strip_optimizer: tuple[int, ...]


def plan_retention(checkpoints: list[CheckpointInfo], cfg: Rules,
                   pinned: frozenset[int] = frozenset()) -> RetentionPlan:
    """`pinned` steps are neither deleted nor stripped this time (a copy to the cold tier reads them)."""
    newest_first = sorted(checkpoints, key=lambda c: c.step, reverse=True)
    keep = max(cfg.keep_last, 2)
    delete = tuple(
        c.step for c in newest_first[keep:]
        if not (cfg.keep_every_steps and c.step % cfg.keep_every_steps == 0) and c.step not in pinned
    )
    survivors = [c for c in newest_first if c.step not in delete]
    strip: tuple[int, ...] = ()
    if cfg.optimizer_on_last:
        strip = tuple(c.step for c in survivors[cfg.optimizer_on_last:] if c.has_optimizer and c.step not in pinned)
    return RetentionPlan(delete=delete, strip_optimizer=strip)
