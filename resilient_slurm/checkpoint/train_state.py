"""train_state.json: where a checkpoint's run stood, as one frozen record. [pure]

Written at every save, read at every resume, by the built-in trainer and by a user's own loop
(`api.Session`) alike. The reader is tolerant, because a checkpoint outlives the code that wrote
it: a field an older writer did not know reads as its default, and fields this version does not
know are kept (`extra`) and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class TrainState:
    step: int
    """The last completed step; a resume continues at step + 1."""
    tokens_seen: int = 0
    train_seconds: float = 0.0
    """Seconds spent in steps (not in saves, evaluations or restarts), summed over attempts."""
    reason: str = ""
    """Why the save was made: periodic, time, emergency, final, pause, memory, eval, requested (a loop's `save`)."""
    saved_at: str = ""
    world_size: int = 1
    run_id: str = ""
    config_hash: str = ""
    """The run's config hash when this was saved: another one means the run's hyperparameters changed
    since (a search's explore step), or another run saved it (a PBT member's copied checkpoint)."""
    data_state: dict[str, Any] | None = None
    """The data position, as the registered data object's `state_dict()` gave it (JSON): a user's loop's
    own, or the built-in trainer's pipeline's (rows or windows consumed over all ranks, the epoch, the
    batch they were cut into, and a token mixture's phase and sources under `mixture`)."""
    lora: dict[str, Any] | None = None
    """A LoRA run's adapters (rank, alpha, dropout, targets)."""
    base_model: dict[str, Any] | None = None
    """A LoRA run's frozen base: {path, identity}."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this version does not know, kept as they were read."""

    def to_json(self) -> dict[str, Any]:
        """The file's content: known fields left at None are not written."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> TrainState:
        known = {f.name for f in fields(TrainState)} - {"extra"}
        if not isinstance(doc.get("step"), int):
            raise ValueError(f"train_state.json: no integer step (found {doc.get('step')!r})")
        doc = _one_data_position(doc)
        return TrainState(**{k: v for k, v in doc.items() if k in known},
                          extra={k: v for k, v in doc.items() if k not in known})


_OLD_POSITION = ("samples_consumed", "epoch", "global_batch_size", "micro_batch_size")


def _one_data_position(doc: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of the built-in trainer written before the data position had one field: its
    `samples_consumed`, `epoch`, batch sizes and token mixture (`data`) become the pipeline's
    `data_state`, as the pipeline writes it now."""
    if doc.get("data_state") is not None or not any(doc.get(k) is not None for k in (*_OLD_POSITION, "data")):
        return doc
    position = {k: doc[k] for k in _OLD_POSITION if doc.get(k) is not None}
    if doc.get("data") is not None:
        position["mixture"] = doc["data"]
        position.setdefault("samples_consumed", doc["data"]["sequences"])
    rest = {k: v for k, v in doc.items() if k not in (*_OLD_POSITION, "data")}
    return {**rest, "data_state": position}
