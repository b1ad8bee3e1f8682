"""What the trainer trains on, behind one face: chat rows (fine-tuning) or token windows of a weighted
mixture (pretraining, `data.kind=tokens`). Each pipeline gives the trainer a sampler with the same
interface (`data/batches.py: PackedBatchSampler`), and says what its data position is in
train_state.json, in the ledger and in the metrics.

The chat position is one integer (rows consumed). The token position is a global counter plus the
data phase and where each source stands (`data/tokens/sampler.py: position()`): the seed's "current
data shard", recorded in every checkpoint, in the stop event after an emergency save, and per step
as each source's realized share. A resume restores it at any world size; a new `data.phase` with
new sources or weights begins a recorded data phase there (how annealing mixes are done).
"""

from __future__ import annotations

from typing import Any, Protocol

from resilient_slurm import ledger
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.data.batches import Batch, PackedBatchSampler
from resilient_slurm.data.chat.dataset import ChatData
from resilient_slurm.data.tokens.sampler import metrics_row
from resilient_slurm.data.tokens.token_data import TokenData


class Sampler(Protocol):
    """What the trainer asks of a sampler (both `PackedBatchSampler` and `TokenBatchSampler`)."""

    micro_batch_size: int
    accumulation: int

    @property
    def state(self) -> Any: ...
    @property
    def epoch(self) -> int: ...
    @property
    def rows_per_rank(self) -> int: ...
    @property
    def stream(self) -> Any: ...
    def set_micro_batch_size(self, micro: int) -> None: ...
    def batch_at(self, position: int) -> list[Batch]: ...
    def next_batch(self) -> list[Batch]: ...


class ChatPipeline:
    def __init__(self, cfg: Config, data: ChatData, rank: int, world_size: int) -> None:
        self.data = data
        self.sampler: Sampler = PackedBatchSampler(data.train, cfg.data, cfg.train.seed, rank, world_size)
        self.documents = True
        """Rows hold several conversations: the model keeps attention inside each."""

    def record(self) -> dict[str, Any]:
        return self.data.fingerprint.to_record()

    def ready(self) -> ledger.DataReady:
        d, stats = self.data, self.data.stats
        return ledger.DataReady(digest=d.fingerprint.digest, files=len(d.fingerprint.files), rows=d.train.num_rows,
                                val_rows=d.val.num_rows, cache_hit=stats.cache_hit, seconds=round(stats.seconds, 3),
                                counts=stats.to_dict())

    def summary(self) -> str:
        """What trains and what is held out, for the run's first log line."""
        d = self.data.stats
        return (f"{d.conversations - d.val_conversations} conversations train ({d.train_rows} rows, {d.train_tokens} "
                f"tokens), {d.val_conversations} held out ({d.val_rows} rows, {d.val_tokens} tokens)"
                + ("" if d.val_rows else "; validation is off (data.val_samples)"))

    def restore(self, ts: TrainState | None) -> list[ledger.Details]:
        self.sampler.state.samples_consumed = ts.samples_consumed or 0 if ts else 0
        return []

    def position(self) -> dict[str, Any]:
        return {}

    def advanced(self, before: int, after: int) -> tuple[dict[str, Any], list[ledger.Details]]:
        """The step's extra metrics and the events its data crossed (none for chat rows)."""
        return {}, []


class TokenPipeline:
    def __init__(self, cfg: Config, data: TokenData, rank: int, world_size: int) -> None:
        self.data = data
        self.token_sampler = data.sampler(rank, world_size)
        self.sampler: Sampler = self.token_sampler
        self.documents = cfg.data.document_mask
        """Without data.document_mask a window is one causal sequence: the model's plain causal kernel."""
        self.mixture = cfg.data.mixture()

    def record(self) -> dict[str, Any]:
        return {"kind": "tokens", "fingerprint": self.token_sampler.position()["fingerprint"],
                "sources": {s.name: {"digest": s.digest, "tokens": s.num_tokens} for s in self.data.sources}}

    def ready(self) -> ledger.DataReady:
        s = self.data.stats
        return ledger.DataReady(digest=self.token_sampler.position()["fingerprint"], files=sum(
            len(src.files) for src in self.data.sources), rows=sum(o.train_windows for o in self.data.orders),
            val_rows=sum(v.num_rows for v in self.data.val.values()), cache_hit=not s.index_built,
            seconds=round(s.seconds, 3), counts=s.to_dict())

    def summary(self) -> str:
        """The sources, their training windows and their held-out ones, for the run's first log line."""
        val = sum(v.num_rows for v in self.data.val.values())
        return (f"{len(self.data.sources)} token source(s) ({self.mixture}), "
                f"{sum(o.train_windows for o in self.data.orders)} "
                f"training windows, {val} held out" + ("" if val else "; validation is off"))

    def restore(self, ts: TrainState | None) -> list[ledger.Details]:
        """Continue at the checkpoint's position; a new data phase that begins here is an event."""
        phase = self.token_sampler.restore(ts.data if ts else None)
        if phase is None:
            return []
        return [ledger.DataPhase(phase=phase.name, sources={s.name: s.weight for s in phase.sources},
                                 sequences=self.sampler.state.samples_consumed)]

    def position(self) -> dict[str, Any]:
        """For train_state.json: the global counter, the phase and each source's place."""
        return {"data": self.token_sampler.position()}

    def advanced(self, before: int, after: int) -> tuple[dict[str, Any], list[ledger.Details]]:
        """The sources' realized shares (metrics and tracker), and each source entering a new epoch."""
        epochs: list[ledger.Details] = [ledger.SourceEpoch(source=name, epoch=epoch) for name, epoch in
                                        self.token_sampler.epoch_changes(before, after)]
        return metrics_row(self.token_sampler.position()), epochs

