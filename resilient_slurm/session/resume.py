"""What a loop registers with its Session, checked when it is registered, and how it comes back.

A loop registers its model, optimizer and scheduler (saved as named tensors and JSON) and its data
position, `data_state`: an object with `state_dict()` and `load_state_dict()` (the built-in
trainer's data pipelines are such objects, and so is examples/own_loop's `TokenStream`), or a
dict. It is saved as JSON in train_state.json, so registration checks it: an object without
`state_dict` is refused at once, not at the first save hours later, and so is a position JSON
cannot hold; numpy integers and floats (and 0-dim tensors) are saved as plain numbers, at every
save, so an emergency save never fails on them. An object with `describe()` says where it stands in
the ledger's `stop` event.

`load_newest` loads the newest checkpoint that verifies into what is registered, and reseeds
nothing: a resume restores each rank's saved random states, and a fresh start leaves every
generator as the loop seeded it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from resilient_slurm import ledger
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.load import Refusal, Restored
from resilient_slurm.errors import InputError
from resilient_slurm.ledger import EventLog
from resilient_slurm.session.step_record import NotPlain, describe, plain_json


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class Registered:
    """The state a Session saves and restores."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 data_state: Stateful | dict[str, Any] | None = None) -> None:
        if data_state is not None and not isinstance(data_state, dict):
            lacking = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(data_state, m, None))]
            if lacking:
                raise InputError(f"data_state: {describe(data_state)} has no {' and no '.join(f'{m}()' for m in lacking)};"
                                 f" register an object with state_dict() and load_state_dict() that holds the data "
                                 f"position (a DataLoader has neither: wrap its epoch and batch in one), or a dict")
        self.model, self.optimizer, self.scheduler, self.data_state = model, optimizer, scheduler, data_state
        self.position()

    def position(self) -> dict[str, Any] | None:
        """The data position as train_state.json holds it; InputError naming what JSON cannot hold."""
        if self.data_state is None:
            return None
        state = self.data_state if isinstance(self.data_state, dict) else self.data_state.state_dict()
        if not isinstance(state, Mapping):
            raise InputError(f"data_state.state_dict() returned {describe(state)}; return a dict (JSON) of the data "
                             f"position")
        try:
            return plain_json(state, "data_state")
        except NotPlain as e:
            raise InputError(f"{e}, which train_state.json cannot hold; keep the data position to numbers, strings, "
                             f"lists and dicts") from None

    def restore(self, saved: dict[str, Any] | None) -> None:
        """Put the data position back (nothing to do without a saved one, or without a registered one)."""
        if self.data_state is None or saved is None:
            return
        if isinstance(self.data_state, dict):
            self.data_state.clear()
            self.data_state.update(saved)
        else:
            self.data_state.load_state_dict(saved)

    def describe(self) -> dict[str, Any] | None:
        """Where the data stands, for the ledger's stop event: the data object's own `describe()`, if any."""
        describe_it = getattr(self.data_state, "describe", None)
        return describe_it() if callable(describe_it) else None


def load_newest(checkpointer: Checkpointer, state: Registered, rank: int, events: EventLog, refusal: Refusal | None,
                reinitialise: Callable[[], None] | None, before_step: int | None = None) -> Restored | None:
    """Load the newest valid checkpoint (of a step before `before_step`) into `state`'s model,
    optimizer and scheduler. Without one, the state is what a fresh start has: `reinitialise` puts
    back what a damaged checkpoint partly overwrote (a loop that cannot rebuild its state raises
    instead; the next launch skips the damaged checkpoint, which is moved aside). A checkpoint
    this run must not continue from (`refusal`, or a model whose tensors changed since) raises
    CheckpointRefused, an InputError: nothing is moved aside."""
    outcome = checkpointer.resume(state.model, state.optimizer, state.scheduler, before_step=before_step,
                                  refusal=refusal)
    if rank == 0:
        for path, reason in outcome.skipped:
            events.emit(ledger.CheckpointSkipped(path=str(path), reason=reason), None)
    if outcome.restored is None and (outcome.touched_state or before_step is not None):
        if reinitialise is None:
            raise RuntimeError("a damaged checkpoint was partly loaded before it was found bad, and no checkpoint "
                               "is left to fall back on; launch again to start fresh")
        reinitialise()
    return outcome.restored
