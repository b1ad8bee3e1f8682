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
    """Why the save was made: periodic, time, emergency, final, pause, memory."""
    saved_at: str = ""
    world_size: int = 1
    run_id: str = ""
    config_hash: str = ""
    """The run's config hash when this was saved: another one means the run's hyperparameters changed
    since (a search's explore step), or another run saved it (a PBT member's copied checkpoint)."""
    epoch: int | None = None
    samples_consumed: int | None = None
    """The built-in trainer's data position: rows consumed over all ranks."""
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    data_state: dict[str, Any] | None = None
    """A user loop's data position, as its `state_dict()` gave it (JSON)."""
    data: dict[str, Any] | None = None
    """The token mixture's position: the global counter, the data phase, each source's place."""
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
        return TrainState(**{k: v for k, v in doc.items() if k in known},
                          extra={k: v for k, v in doc.items() if k not in known})
