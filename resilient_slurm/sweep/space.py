"""The search space, written in Hydra's override grammar: `KEY=choice(a,b)`, `KEY=range(8,64,step=8)`,
`KEY=interval(1e-5,1e-3)`, `KEY=tag(log,interval(1e-5,1e-3))` (and `KEY=a,b`). Pure.

Parsing checks everything that can be checked before a trial is submitted: the grammar, that the
key exists in the composed config and may be searched, that a range is not empty or reversed, and
that a log scale has positive bounds. Each problem is one line naming the argument and the fix.
An interval on an integer key searches integers; grids take choices and ranges only.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
from hydra.errors import HydraException

from resilient_slurm.config.checks import suggest
from resilient_slurm.errors import InputError

# Keys a search must not touch: the controller names the trials and owns the sweep settings, and
# the pause step is how it schedules them.
_NOT_SEARCHABLE = ("run.", "sweep.", "train.pause_at_step")
_LOG_TAG = "log"


class SpaceError(InputError):
    """The search space is wrong; one line per problem, each naming the argument and the fix."""


@dataclass(frozen=True)
class Dimension:
    """One searched key: a list of choices, or a numeric interval (integer or float, maybe log)."""

    key: str
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    integer: bool = False
    log: bool = False

    @property
    def is_choice(self) -> bool:
        return bool(self.choices)

    def sample(self, rng: random.Random) -> Any:
        """A value drawn from the prior: uniform over choices, uniform (or log-uniform) in the interval."""
        if self.is_choice:
            return rng.choice(self.choices)
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return min(max(round(value), int(self.low)), int(self.high)) if self.integer else value


def is_search_argument(arg: str) -> bool:
    """True for `KEY=SPACE` (a sweep in Hydra's grammar), False for a plain override."""
    if "=" not in arg or arg.startswith("~"):
        return False
    value = arg.partition("=")[2]
    return any(value.startswith(f"{fn}(") for fn in ("choice", "range", "interval", "tag", "int", "float", "shuffle")) \
        or _is_simple_choice(arg)


def _is_simple_choice(arg: str) -> bool:
    try:
        return OverridesParser.create().parse_override(arg).is_sweep_override()
    except HydraException:
        return False


def parse_space(args: list[str], config: Mapping[str, Any]) -> list[Dimension]:
    """The dimensions of `KEY=SPACE` arguments, checked against the flattened composed config
    (`{"optim.lr": 1e-4, ...}`); raises SpaceError with every problem, one line each."""
    problems: list[str] = []
    dims: list[Dimension] = []
    seen: set[str] = set()
    parser = OverridesParser.create()
    for arg in args:
        try:
            override = parser.parse_override(arg)
        except HydraException as e:
            problems.append(f"{arg}: {_grammar_problem(e)}")
            continue
        key = override.key_or_group
        if key in seen:
            problems.append(f"{arg}: {key} is searched twice; keep one space per key")
            continue
        seen.add(key)
        if key.startswith(_NOT_SEARCHABLE):
            problems.append(f"{arg}: {key} cannot be searched (the controller sets it); search a model, data, "
                            f"optim or train key")
            continue
        if key not in config:
            close = suggest(key, config)
            hint = f"did you mean {close}?" if close else "see config.yaml of a run for the keys"
            problems.append(f"{arg}: {key} is not a config key; {hint}")
            continue
        try:
            dims.append(_dimension(key, override.value(), config[key]))
        except SpaceError as e:
            problems.append(f"{arg}: {e}")
    if problems:
        raise SpaceError("\n".join(problems))
    if not dims:
        raise SpaceError("no search space; add at least one KEY=SPACE, e.g. 'optim.lr=tag(log,interval(1e-5,1e-3))'")
    return dims


def _grammar_problem(e: HydraException) -> str:
    text = str(e).splitlines()[0]
    if "Unknown function 'log'" in text:
        return "log(...) is not a function; write tag(log,interval(A,B)) for a log-uniform interval"
    return f"{text}; write choice(a,b,...), range(start,stop[,step]), interval(low,high) or tag(log,interval(low,high))"


def _dimension(key: str, value: Any, default: Any) -> Dimension:
    tags = set(getattr(value, "tags", None) or ())
    unknown = tags - {_LOG_TAG}
    if unknown:
        raise SpaceError(f"unknown tag(s) {', '.join(sorted(unknown))}; the only tag is log")
    log = _LOG_TAG in tags
    integer = isinstance(default, int) and not isinstance(default, bool)
    if isinstance(value, ChoiceSweep):
        choices = tuple(value.list)
        if log:
            raise SpaceError("tag(log, ...) applies to an interval; drop it or use tag(log,interval(low,high))")
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in choices):
            raise SpaceError("choices must be a single value each (a number, a string, true/false)")
        if len(set(map(repr, choices))) != len(choices):
            raise SpaceError("a choice is listed twice; list each value once")
        return Dimension(key, choices=choices)
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if start is None or stop is None or not step:
            raise SpaceError("range needs a start, a stop and a step that is not 0; write range(start,stop[,step])")
        points = tuple(_range_points(start, stop, step))
        if not points:
            raise SpaceError(f"range({start},{stop},step={step}) is empty; make start < stop for a positive step")
        return Dimension(key, choices=points)
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        if low is None or high is None or not low < high:
            raise SpaceError(f"interval({low},{high}) is empty or reversed; write interval(low,high) with low < high")
        if log and low <= 0:
            raise SpaceError(f"a log interval needs positive bounds, got {low}; raise the low bound above 0")
        if integer and not (float(low).is_integer() and float(high).is_integer()):
            raise SpaceError(f"{key} is an integer; give whole bounds, e.g. interval({math.ceil(low)},{math.floor(high)})")
        if not integer and not isinstance(default, float):
            raise SpaceError(f"{key} is not numeric ({default!r}); search it with choice(...)")
        return Dimension(key, low=float(low), high=float(high), integer=integer, log=log)
    raise SpaceError("not a search space; use choice, range or interval (optionally tag(log, ...))")


def _range_points(start: float, stop: float, step: float) -> list[float]:
    points, value = [], start
    while (step > 0 and value < stop) or (step < 0 and value > stop):
        points.append(value)
        value = start + step * len(points)  # by multiplication: no drift over many float steps
    return points


def grid_points(dims: list[Dimension]) -> list[dict[str, Any]]:
    """Every combination of the dimensions' choices, in order (the last key varies fastest)."""
    bad = [d.key for d in dims if not d.is_choice]
    if bad:
        raise SpaceError(f"{', '.join(bad)}: an interval has no grid points; use choice(...) or range(...) with "
                         f"sweep=grid, or another sampler")
    return [dict(zip((d.key for d in dims), combo)) for combo in itertools.product(*(d.choices for d in dims))]


def override(key: str, value: Any) -> str:
    """`key=value` as a Hydra override (for the record; values reach the config unparsed)."""
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, float):
        return f"{key}={value!r}"
    if isinstance(value, str) and not value.replace("_", "").replace("-", "").replace(".", "").isalnum():
        return f"{key}='{value}'"
    return f"{key}={value}"
