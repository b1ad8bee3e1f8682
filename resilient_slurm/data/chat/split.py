"""How many distinct conversations a run holds out for validation (`data.val_samples`). Pure.

    null (the default)   min(256, 5%), and never so many that fewer than 90% are left to train on
    0                    none: validation and exact match are off
    a fraction in (0, 1) that share of the distinct conversations (at least one)
    a whole number >= 1  that many

Why a default that scales: a fixed 256 refused a 240-conversation file outright and took most of a
400-conversation one; common fine-tuning tools hold out a small share or nothing. The 256 cap keeps
evaluation cheap on large sets, where a few hundred conversations already measure the loss well.
"""

from __future__ import annotations

DEFAULT_CAP = 256
DEFAULT_SHARE = 0.05
MIN_TRAIN_SHARE = 0.9


def held_out(distinct: int, val_samples: float | None) -> int:
    """Conversations to hold out of `distinct` ones. A requested count or share that leaves nothing
    to train on is the caller's to refuse; the default never does."""
    if val_samples is None:
        return min(DEFAULT_CAP, round(DEFAULT_SHARE * distinct), int(distinct * (1 - MIN_TRAIN_SHARE)))
    if val_samples == 0:
        return 0
    if val_samples < 1:
        return max(1, round(val_samples * distinct))
    return int(val_samples)
