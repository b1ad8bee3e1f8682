"""Replay verification: the steps a restart recomputes were computed before, so they must come out
the same. Pure.

A resume moves the metrics rows of the steps after its checkpoint to `metrics-lost.jsonl`: that
work is about to be redone. Resume is exact (the model, the optimizer, the RNG and the data
position all come back), so each redone step's loss must equal the lost row's, bit for bit. A
difference means the restored state is not what was saved (bytes damaged after their CRCs were
taken: in memory before the copy, on the way back into the device) or the machine computes
differently from the one before (silent corruption). This module holds the comparison and what
to do about a difference; `session.Session` feeds it and acts.

What is compared, and when not:
- rank 0's `loss`, as `metrics.jsonl` holds it (a float written by `json`, whose repr round-trips
  exactly; NaN equals NaN, since JSON keeps no NaN payload);
- only rows the attempt before this one computed (after its own resume and any rollback), and
  only when this attempt runs what that one ran: the same world size, no `oom_retry` in it (the
  micro-batch changed under its rows) and no `config_changed` since it started. A reshard keeps
  the losses within float tolerance, not the bits, so it is not compared;
- on a GPU only with `train.deterministic=true` (nondeterministic kernels differ run to run);
  `expectations` is told whether the kernels are deterministic.

What a difference leads to (`decide`): the copy that served the restore is set aside and the run
falls back to the next source, the next tier of the same step (memory, then the disk's hot tier,
then the cold tier) or the previous checkpoint, up to `max_fallbacks` times in one attempt. A
difference that persists after that is no longer one bad copy: the machine is suspect. A loss is
global, so it cannot say which node computed wrong; the suspects are the nodes of the run, narrowed
by the earlier persistent differences of the same run (the nodes they all shared). When one node
remains, it is drained; otherwise the attempt stops comparing and trains on, and the ledger says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.ledger import ConfigChanged, Event, OomRetry, Resume, Rollback, Start

METRIC = "loss"
FALLBACK, DRAIN, CONTINUE = "fallback", "drain", "continue"


def same_value(expected: float, got: float) -> bool:
    """Equal as `metrics.jsonl` keeps them: bit for bit, except that NaN equals NaN."""
    if math.isnan(expected) or math.isnan(got):
        return math.isnan(expected) and math.isnan(got)
    return expected == got and math.copysign(1.0, expected) == math.copysign(1.0, got)


def loss_of(row: Mapping[str, Any]) -> float | None:
    value = row.get(METRIC)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True)
class Expected:
    """What a replay compares against, or why it compares nothing."""

    losses: dict[int, float]
    floor: int
    """Rows of steps at or before it came from older attempts: never expected."""
    why_not: str | None = None


def expectations(rows: Iterable[Mapping[str, Any]], history: Sequence[Event[Any]], world_size: int,
                 deterministic: bool) -> Expected:
    """The losses a resume's replay must reproduce, from the rows it moved aside (`rows`) and the
    ledger up to this attempt's `start` (its last one)."""
    if not deterministic:
        return Expected({}, 0, "nondeterministic kernels on a GPU (set train.deterministic=true to compare)")
    starts = [i for i, e in enumerate(history) if isinstance(e.details, Start)]
    if len(starts) < 2:
        return Expected({}, 0, "no earlier attempt in the ledger computed them")
    before, now = starts[-2], starts[-1]
    previous = history[before]
    assert isinstance(previous.details, Start)
    between = history[before + 1:now]
    floor = max([e.step or 0 for e in between if isinstance(e.details, (Resume, Rollback))], default=0)
    if previous.details.world_size != world_size:
        return Expected({}, floor, f"the world size changed ({previous.details.world_size} -> {world_size}): "
                                   f"a reshard keeps the losses within float tolerance, not the bits")
    if any(isinstance(e.details, OomRetry) for e in between):
        return Expected({}, floor, "the micro-batch changed during the attempt that computed them (oom_retry)")
    if any(isinstance(e.details, ConfigChanged) for e in history[before + 1:]):
        return Expected({}, floor, "the config changed since they were computed (config_changed)")
    return Expected(admit({}, rows, floor), floor)


def admit(losses: dict[int, float], rows: Iterable[Mapping[str, Any]], floor: int) -> dict[int, float]:
    """`losses` with the rows above `floor` added; a step already expected keeps its value."""
    out = dict(losses)
    for row in rows:
        step, value = row.get("step"), loss_of(row)
        if isinstance(step, int) and step > floor and value is not None:
            out.setdefault(step, value)
    return out


@dataclass(frozen=True)
class Mismatch:
    step: int
    expected: float
    got: float


@dataclass
class Replay:
    """One attempt's replay on rank 0: what it expects, what it compared, the difference found."""

    losses: dict[int, float] = field(default_factory=dict)
    floor: int = 0
    compared: int = 0
    first: int | None = None
    mismatch: Mismatch | None = None
    """A difference found at the newest step, not yet acted on."""
    tries: int = 0
    """Differences found in this attempt (each acted on)."""

    @property
    def armed(self) -> bool:
        return bool(self.losses)

    @property
    def last(self) -> int:
        return max(self.losses, default=0)

    def arm(self, expected: Expected) -> None:
        self.losses, self.floor, self.compared, self.first, self.mismatch = dict(expected.losses), expected.floor, 0, \
            None, None

    def check(self, step: int, row: Mapping[str, Any]) -> Mismatch | None:
        """Compare a recomputed step's row; the difference, if any (kept until acted on)."""
        expected = self.losses.get(step)
        got = loss_of(row)
        if expected is None or got is None:
            return None
        self.compared += 1
        self.first = step if self.first is None else self.first
        if same_value(expected, got):
            return None
        self.mismatch = Mismatch(step, expected, got)
        return self.mismatch

    def fell_back(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Back at an older state: the rows moved aside now are expected too, and the count of
        matching steps starts again from it."""
        self.losses = admit(self.losses, rows, self.floor)
        self.mismatch, self.compared, self.first = None, 0, None
        self.tries += 1

    def done(self, step: int) -> bool:
        """Every expected step up to the last has been recomputed."""
        return self.armed and self.mismatch is None and step >= self.last

    def clear(self) -> None:
        self.losses, self.mismatch = {}, None


@dataclass(frozen=True)
class Decision:
    action: str
    """fallback, drain or continue."""
    reason: str
    before_step: int | None = None
    """fallback: load only checkpoints of earlier steps than this."""
    drain: tuple[str, ...] = ()


def decide(tries: int, max_fallbacks: int, step: int, source: str, nodes: Sequence[str],
           earlier: Sequence[Sequence[str]]) -> Decision:
    """What to do about a difference. `tries`: differences found in this attempt, this one
    included; `step`, `source`: the checkpoint the state came from and its tier; `nodes`: the run's;
    `earlier`: the nodes of this run's earlier persistent differences (drained or trained on)."""
    if tries <= max_fallbacks:
        # The cold tier is the last copy of a step: after it, the previous checkpoint. Otherwise the
        # copy that served is set aside, and the step's next copy (if any) is the next candidate.
        before = step if source == "cold" else step + 1
        what = "the previous checkpoint" if source == "cold" else "the next copy of this step, else the previous checkpoint"
        return Decision(FALLBACK, f"difference {tries} of at most {max_fallbacks} fallbacks: the {source} copy of "
                                  f"step {step} is set aside; loading {what}", before)
    suspects = set(nodes)
    for shared in earlier:
        if suspects & set(shared):
            suspects &= set(shared)
    if len(suspects) == 1:
        (node,) = suspects
        return Decision(DRAIN, f"the difference persisted after {max_fallbacks} fallbacks, and node {node} is "
                               f"the one node every persistent difference of this run shared", drain=(node,))
    return Decision(CONTINUE, f"the difference persisted after {max_fallbacks} fallbacks; a loss cannot say which "
                              f"of {len(suspects)} nodes computed it, so this attempt stops comparing and trains on")
