"""What every rank agrees at the end of a step, and where the loop stands. [pure]

One all-reduce of a few floats per step carries the stop flag any rank raised, rank 0's verdict of
the time-based save policy, rank 0's replay verdict, and each rank's compute and data-wait time (a sum of one-hot vectors is
an all-gather). Every rank decodes the same `StepSync`, so every rank saves the same step and a
stop never cuts a step in half.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    """Where the loop stands: the last step every rank ended, the tokens and the step time so far."""

    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0


@dataclass(frozen=True)
class StepSync:
    """What every rank agreed at the end of a step."""

    stop: bool
    save_time_due: bool
    compute_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    replay_mismatch: bool = False
    """Rank 0's replay found this step different from the value logged before the failure."""

    @staticmethod
    def encode(stop: bool, save_time_due: bool, rank: int, world: int, compute_s: float, wait_s: float,
               replay_mismatch: bool = False) -> list[float]:
        return [float(stop), float(save_time_due)] + one_hot(world, rank, compute_s) + one_hot(world, rank, wait_s) \
            + [float(replay_mismatch)]

    @staticmethod
    def decode(values: list[float], world: int) -> StepSync:
        return StepSync(values[0] > 0, values[1] > 0, tuple(values[2:2 + world]), tuple(values[2 + world:2 + 2 * world]),
                        values[2 + 2 * world] > 0)


def one_hot(size: int, index: int, value: float) -> list[float]:
    out = [0.0] * size
    out[index] = value
    return out
