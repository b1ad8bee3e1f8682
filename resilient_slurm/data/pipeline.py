"""What the trainer trains on, behind one face: chat rows (fine-tuning) or token windows of a weighted
mixture (pretraining, `data.kind=tokens`). Each pipeline gives the trainer a sampler with the same
interface (`data/batches.py: PackedBatchSampler`), and is the run's data position: a `Stateful`
(`state_dict`, `load_state_dict`) that the trainer registers with its Session as `data_state`, as
a user's loop registers its own, so train_state.json holds it in one field.

The chat position is one integer (rows consumed over all ranks). The token position is that global
counter plus the data phase and where each source stands (`data/tokens/sampler.py: position()`,
under `mixture`): the seed's "current data shard", recorded in every checkpoint, in the stop event
after an emergency save (`describe`), and per step as each source's realized share. A resume
restores it at any world size; a new `data.phase` with new sources or weights begins a recorded
data phase there (how annealing mixes are done).
"""

from __future__ import annotations

from typing import Any, Protocol

from resilient_slurm import ledger
from resilient_slurm.config import Config
from resilient_slurm.data.batches import Batch, PackedBatchSampler
from resilient_slurm.data.chat.dataset import ChatData
from resilient_slurm.data.tokens.sampler import TokenBatchSampler, metrics_row
from resilient_slurm.data.tokens.token_data import TokenData


class Sampler(Protocol):
    """What the trainer asks of a sampler (both `PackedBatchSampler` and `TokenBatchSampler`)."""

    micro_batch_size: int
    accumulation: int

    @property
    def epoch(self) -> int: ...
    @property
    def rows_per_rank(self) -> int: ...
    def set_micro_batch_size(self, micro: int) -> None: ...
    def batch_at(self, position: int, rank: int | None = None) -> list[Batch]: ...
    def next_batch(self) -> list[Batch]: ...


class _Pipeline:
    """What both pipelines' positions share: rows (or windows) consumed over all ranks."""

    def __init__(self, cfg: Config, sampler: PackedBatchSampler | TokenBatchSampler) -> None:
        self.global_batch = cfg.data.global_batch_size
        self._sampler = sampler
        self.sampler: Sampler = sampler

    @property
    def position(self) -> int:
        """Rows consumed over all ranks: where the next global batch begins."""
        return self._sampler.state.samples_consumed

    def consumed(self, position: int) -> None:
        """The global batch at `position` was trained (cut by `batch_at`, as replica groups cut
        theirs): the next one begins after it."""
        self._sampler.state.samples_consumed = position + self.global_batch

    def skip(self, batches: int) -> tuple[int, list[int]]:
        """Move past `batches` global batches (a rollback past bad data): where they began, and the
        sample ids they held."""
        first, count = self.position, batches * self.global_batch
        self._sampler.state.samples_consumed = first + count
        return first, self._sampler.stream.indices(first, count)

    def state_dict(self) -> dict[str, Any]:
        """The position for train_state.json, with the epoch and the batch it was cut into."""
        return {"samples_consumed": self.position, "epoch": self._sampler.epoch,
                "global_batch_size": self.global_batch, "micro_batch_size": self._sampler.micro_batch_size}


class ChatPipeline(_Pipeline):
    def __init__(self, cfg: Config, data: ChatData, rank: int, world_size: int) -> None:
        super().__init__(cfg, PackedBatchSampler(data.train, cfg.data, cfg.train.seed, rank, world_size))
        self.data = data
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sampler.state.samples_consumed = int(state.get("samples_consumed") or 0)

    def reset(self) -> None:
        """Back to the first row (a rollback with no checkpoint before it)."""
        self._sampler.state.samples_consumed = 0

    def take_events(self) -> list[ledger.Details]:
        """What the last `load_state_dict` began (none for chat rows)."""
        return []

    def describe(self) -> dict[str, Any]:
        """Where the data stands, for the stop event."""
        return {"samples_consumed": self.position, "epoch": self._sampler.epoch}

    def advanced(self, before: int, after: int) -> tuple[dict[str, Any], list[ledger.Details]]:
        """The step's extra metrics and the events its data crossed (none for chat rows)."""
        return {}, []


class TokenPipeline(_Pipeline):
    def __init__(self, cfg: Config, data: TokenData, rank: int, world_size: int) -> None:
        self.token_sampler = data.sampler(rank, world_size)
        super().__init__(cfg, self.token_sampler)
        self.data = data
        self.documents = cfg.data.document_mask
        """Without data.document_mask a window is one causal sequence: the model's plain causal kernel."""
        self.mixture = cfg.data.mixture()
        self._began: list[ledger.Details] = []

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

    def state_dict(self) -> dict[str, Any]:
        """The global counter, and under `mixture` the phase and each source's place."""
        return {**super().state_dict(), "mixture": self.token_sampler.position()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the checkpoint's position; a new data phase that begins here is an event (`take_events`)."""
        phase = self.token_sampler.restore(state["mixture"])
        self._began = [] if phase is None else [ledger.DataPhase(
            phase=phase.name, sources={s.name: s.weight for s in phase.sources}, sequences=self.position)]

    def reset(self) -> None:
        """Back to the start of the mixture (a rollback with no checkpoint before it)."""
        self.token_sampler.restore(None)
        self._began = []

    def take_events(self) -> list[ledger.Details]:
        """The data phase the last `load_state_dict` began, if it began one."""
        began, self._began = self._began, []
        return began

    def describe(self) -> dict[str, Any]:
        """Each source's file, offset in it, epoch and tokens: the current data shard, for the stop event."""
        keep = ("file", "token", "epoch", "tokens")
        sources = self.token_sampler.position()["sources"]
        return {name: {k: v for k, v in s.items() if k in keep} for name, s in sources.items()}

    def advanced(self, before: int, after: int) -> tuple[dict[str, Any], list[ledger.Details]]:
        """The sources' realized shares (metrics and tracker), and each source entering a new epoch."""
        epochs: list[ledger.Details] = [ledger.SourceEpoch(source=name, epoch=epoch) for name, epoch in
                                        self.token_sampler.epoch_changes(before, after)]
        return metrics_row(self.token_sampler.position()), epochs
