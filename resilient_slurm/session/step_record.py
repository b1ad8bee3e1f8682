"""What a loop hands its Session, checked and turned into what the run keeps. [pure]

- `plain_json`: a value as JSON holds it. A 0-dim tensor, a numpy scalar or a 0-d array becomes its
  number; anything else JSON cannot hold is named (where it is, and its type) in one line, an
  `InputError`. Every rank checks what it is given alike, so a bad value stops every rank with the
  same line, never rank 0 alone (the others would then die on a reset connection).
- `metric_row`: `s.log(step, ...)`'s values, so checked.
- `missed_end_of_step`, `never_ended`: the line for a loop that reached a step without ending the one
  before, or left without ending any.
- `step_line`: the console's line for a step (the built-in trainer's and a user's loop's alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resilient_slurm.errors import InputError

_SCALARS = (str, int, float, bool, type(None))

QUIET = frozenset({"step", "epoch", "tokens", "tokens_per_s", "samples_per_s", "step_seconds", "data_wait_s",
                   "eval_seconds"})
"""Metrics the step line leaves out: bookkeeping that metrics.jsonl keeps (tokens/s is shown at the end)."""
_SHOWN = (("loss", "loss", ".4f"), ("lr", "lr", ".2e"), ("grad_norm", "grad", ".3f"))


class NotPlain(Exception):
    """A value JSON cannot hold; `where` says where it is."""

    def __init__(self, where: str, value: Any) -> None:
        super().__init__(f"{where} is {describe(value)}")
        self.where, self.value = where, value


def plain_json(value: Any, where: str) -> Any:
    """`value` with every number a plain Python one; NotPlain naming the first part JSON cannot hold."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, inner in value.items():
            name = key if isinstance(key, str) else plain_json(key, f"{where}'s key {key!r}")
            out[name] = plain_json(inner, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [plain_json(inner, f"{where}[{i}]") for i, inner in enumerate(value)]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:  # a 0-dim tensor, a numpy scalar or 0-d array
        number = item()
        if isinstance(number, _SCALARS):
            return number
    raise NotPlain(where, value)


def describe(value: Any) -> str:
    """`a torch.Tensor of shape [4]`, `a set`: what a value is, for an error line."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"
    shape = getattr(value, "shape", None)
    return f"a {name}" + (f" of shape {list(shape)}" if shape is not None and not callable(shape) else "")


def metric_row(step: int, values: Mapping[str, Any]) -> dict[str, Any]:
    """One step's metrics as metrics.jsonl and the tracker take them; InputError naming a metric they cannot."""
    row: dict[str, Any] = {"step": step}
    for key, value in values.items():
        try:
            row[key] = plain_json(value, f"metric {key!r}")
        except NotPlain as e:
            raise InputError(f"s.log(step {step}, ...): {e}, which metrics.jsonl cannot hold; log a number or a "
                             f"string (a tensor's .item())") from None
    return row


def missed_end_of_step(step: int, ended: int, where: str) -> str | None:
    """Why a loop that reached `step` in `where` (s.log, s.steps) while the last step it ended is
    `ended` must stop now; None when it has ended the step before."""
    if step <= ended + 1:
        return None
    return (f"{where} reached step {step} before s.end_of_step({step - 1}): call s.end_of_step(step) after every "
            f"step, on every rank; it agrees a stop across ranks and makes every save, so without it nothing is saved")


def never_ended(reached: int) -> str:
    """Why a loop that ran to step `reached` without ever calling `end_of_step` must not finish."""
    return (f"the loop ran to step {reached} without calling s.end_of_step(step): call it after every step, on "
            f"every rank; it agrees a stop across ranks and makes every save, so without it nothing is saved")


def line_due(step: int, every: int) -> bool:
    """The step line is printed at the first step and every `train.log_every_steps`."""
    return step == 1 or (every > 0 and step % every == 0)


def step_line(step: int, total: int | None, row: Mapping[str, Any]) -> str:
    """`step 5/200 | loss 2.3456 | lr 3.00e-04 | grad 0.812 | 1234 tok/s`: the loss, learning rate and
    gradient norm when logged, then the loop's other metrics, then tokens per second (logged, or
    its `tokens` over the step's seconds)."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    parts += [f"{label} {row[key]:{fmt}}" for key, label, fmt in _SHOWN if _number(row.get(key))]
    known = {key for key, _, _ in _SHOWN} | QUIET
    parts += [f"{key} {value:.4g}" for key, value in row.items()
              if key not in known and "/" not in key and not key.startswith("gpu_") and _number(value)]
    rate = row.get("tokens_per_s")
    tokens, seconds = row.get("tokens"), row.get("step_seconds")
    if not _number(rate) and _number(tokens) and _number(seconds) and tokens and seconds:
        rate = tokens / seconds
    if _number(rate):
        parts.append(f"{rate:.0f} tok/s")
    return " | ".join(parts)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
