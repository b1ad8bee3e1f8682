"""Global batches of token windows at an exact position, cut into each rank's micro-batches.

The token pipeline's `PackedBatchSampler`: the same methods and attributes (`next_batch`, `batch_at`,
`set_micro_batch_size`, `state.samples_consumed`, `epoch`, `rows_per_rank`, `micro_batch_size`,
`accumulation`, `stream.indices`), the same `Batch`, and the same cut of a global batch into
micro-batches (micro-batch m of rank r is chunk m*world+r), so a global batch is the same at every
world size. Its state is the global counter and the data phase (position.py): `position()` is the
JSON-able record for train_state.json, `restore(record)` continues from one.

A window is seq_len + 1 tokens of its source's stream: the first seq_len are the input, the last
seq_len the labels. With data.document_mask each token also carries its document's index in the
window, so attention and positions stay inside a document and nothing predicts across a boundary
(Batch.document_ids, as packed chat rows); without it the window is one causal sequence with
positions 0..seq_len-1, as Megatron trains by default (its document_ids are all 0: a caller should
pass None to the model then, so attention takes the plain causal kernel instead of a mask).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from resilient_slurm.config import DataConfig
from resilient_slurm.data.tokens.errors import SourceExhausted
from resilient_slurm.data.tokens.order import SourceOrder
from resilient_slurm.data.tokens.plan import BlockPlan
from resilient_slurm.data.tokens.position import Phase, Windows, continue_phase
from resilient_slurm.data.batches import Batch, rank_micro_batches
from resilient_slurm.data.packing import labels_and_positions


def windows_batch(orders: Sequence[SourceOrder], picks: Sequence[tuple[int, int]], document_mask: bool) -> Batch:
    """The Batch of windows `picks` = (source index, window id), one row each."""
    rows = len(picks)
    length = orders[0].seq_len
    tokens = np.empty((rows, length + 1), np.int64)
    docs = np.zeros((rows, length + 1), np.int64)
    for row, (s, w) in enumerate(picks):
        tokens[row], begins = orders[s].source.read(w * length, w * length + length + 1, document_mask)
        if document_mask:
            docs[row] = np.cumsum(begins)
    labels, positions = labels_and_positions(tokens, docs, np.ones_like(tokens))
    return Batch(*(torch.from_numpy(np.ascontiguousarray(a[:, :length])) for a in (tokens, labels, positions, docs)))


class ValRows:
    """A source's held-out windows, with PackedRows' interface (num_rows, batch(rows))."""

    def __init__(self, orders: Sequence[SourceOrder], index: int, document_mask: bool) -> None:
        self.orders, self.index, self.document_mask = orders, index, document_mask

    @property
    def num_rows(self) -> int:
        return len(self.orders[self.index].val)

    def batch(self, rows: Sequence[int]) -> Batch:
        val = self.orders[self.index].val
        return windows_batch(self.orders, [(self.index, int(val[r])) for r in rows], self.document_mask)


class TokenStream:
    """The global order of a data phase: position → (source, window)."""

    def __init__(self, orders: Sequence[SourceOrder], phase: Phase, repeat: bool) -> None:
        self.orders, self.phase, self.repeat = orders, phase, repeat
        by_name = {o.source.name: i for i, o in enumerate(orders)}
        self.members = [by_name[s.name] for s in phase.sources]
        self.plan = BlockPlan([s.name for s in phase.sources], [s.weight for s in phase.sources])
        self.bases = np.array([s.base for s in phase.sources], np.int64)
        self.offsets = np.concatenate(([0], np.cumsum([o.windows for o in orders])))
        """Where each source's windows begin among all sources' (the global sequence ids)."""

    def counters(self, position: int) -> np.ndarray:
        """Each phase source's own counter at global `position`."""
        return self.bases + self.plan.consumed(position - self.phase.start)

    def picks(self, start: int, count: int) -> list[tuple[int, int]]:
        """(source index, window id) of global positions [start, start + count)."""
        if start < self.phase.start:
            raise ValueError(f"position {start} lies before data phase {self.phase.name!r} (from {self.phase.start})")
        slot, counter = self.plan.locate(np.arange(start, start + count) - self.phase.start)
        counter = counter + self.bases[slot]
        out = []
        for i, (m, k) in enumerate(zip(slot.tolist(), counter.tolist())):
            order = self.orders[self.members[m]]
            epoch, offset = divmod(k, order.train_windows)
            if epoch and not self.repeat:
                raise SourceExhausted(order.source.name, start + i)
            out.append((self.members[m], int(order.epoch(epoch)[offset])))
        return out

    def indices(self, start: int, count: int) -> list[int]:
        """Global sequence ids (the source's window id after all earlier sources' windows)."""
        return [int(self.offsets[s]) + w for s, w in self.picks(start, count)]


@dataclass
class SamplerState:
    samples_consumed: int = 0


class TokenBatchSampler:
    def __init__(self, orders: Sequence[SourceOrder], cfg: DataConfig, rank: int, world_size: int) -> None:
        self.orders, self.cfg, self.rank, self.world_size = orders, cfg, rank, world_size
        self.windows = Windows(cfg.seq_len, orders[0].seed, cfg.val_sequences)
        self.state = SamplerState()
        self.history: list[dict[str, Any]] = []
        self.stream = TokenStream(orders, *self._phase(None))
        self.micro_batch_size = cfg.micro_batch_size
        self.accumulation = 0
        self.set_micro_batch_size(cfg.micro_batch_size)

    def _phase(self, saved: Mapping[str, Any] | None) -> tuple[Phase, bool]:
        configured = [(s.name, self._order(s.name).source.digest, s.weight) for s in self.cfg.sources]
        phase, self.history = continue_phase(saved, self.cfg.phase, configured, self.windows)
        return phase, self.cfg.on_exhausted == "repeat"

    def _order(self, name: str) -> SourceOrder:
        return next(o for o in self.orders if o.source.name == name)

    @property
    def epoch(self) -> int:
        """The furthest epoch any source of the phase has reached."""
        counters = self.stream.counters(self.state.samples_consumed)
        return max(int(k) // self.orders[m].train_windows for m, k in zip(self.stream.members, counters))

    @property
    def rows_per_rank(self) -> int:
        return self.cfg.global_batch_size // self.world_size

    def set_micro_batch_size(self, micro: int) -> None:
        if self.cfg.global_batch_size % (micro * self.world_size):
            raise ValueError(f"data.global_batch_size={self.cfg.global_batch_size} is not a multiple of "
                             f"micro_batch_size*world_size={micro * self.world_size}")
        self.micro_batch_size = micro
        self.accumulation = self.cfg.global_batch_size // (micro * self.world_size)

    def batch_at(self, position: int, rank: int | None = None) -> list[Batch]:
        """This rank's micro-batches of the global batch at `position`, or data-parallel rank
        `rank`'s (SourceExhausted when data.on_exhausted=stop and a source has nothing left for it)."""
        picks = self.stream.picks(position, self.cfg.global_batch_size)
        mine = rank_micro_batches(list(range(len(picks))), self.micro_batch_size, self.world_size,
                                  self.rank if rank is None else rank, self.accumulation)
        return [windows_batch(self.orders, [picks[i] for i in micro], self.cfg.document_mask) for micro in mine]

    def next_batch(self) -> list[Batch]:
        batch = self.batch_at(self.state.samples_consumed)
        self.state.samples_consumed += self.cfg.global_batch_size
        return batch

    def epoch_changes(self, start: int, stop: int) -> list[tuple[str, int]]:
        """Sources whose own order entered a new epoch between global positions start and stop."""
        before, after = self.stream.counters(start), self.stream.counters(stop)
        out = []
        for m, a, b in zip(self.stream.members, before.tolist(), after.tolist()):
            n = self.orders[m].train_windows
            # Epoch e >= 1 is entered when its first sequence, counter e*n, lies in [a, b).
            out += [(self.orders[m].source.name, e) for e in range(max(1, -(-a // n)), (b - 1) // n + 1)]
        return out

    def position(self) -> dict[str, Any]:
        """The data position, JSON-able: the global counter, the phase, and where each source stands."""
        at = self.state.samples_consumed
        phase = self.stream.phase
        counters = self.stream.counters(at)
        trained = {s.name: s.before + int(k) - s.base for s, k in zip(phase.sources, counters)}
        total = max(sum(trained.values()), 1)
        sources = {}
        for s, m, k in zip(phase.sources, self.stream.members, counters.tolist()):
            order = self.orders[m]
            epoch, offset = divmod(int(k), order.train_windows)
            next_window = int(order.epoch(epoch)[offset]) if epoch == 0 or self.stream.repeat else None
            where = order.source.where(next_window * order.seq_len) if next_window is not None else {}
            sources[s.name] = {"digest": s.digest, "counter": int(k), "trained": trained[s.name],
                               "tokens": trained[s.name] * order.seq_len, "share": trained[s.name] / total,
                               "epoch": epoch, **where}
        return {"sequences": at, "fingerprint": _fingerprint(phase), "seq_len": self.windows.seq_len,
                "seed": self.windows.seed, "val_sequences": self.windows.val_sequences,
                "phase": phase.to_record(), "history": list(self.history), "sources": sources}

    def restore(self, saved: Mapping[str, Any] | None) -> Phase | None:
        """Continue from a saved position (None: the start). Returns the new phase when the
        configured data.phase begins one here (to record), else None; TokenDataError when the
        data changed within the saved phase."""
        previous = saved["phase"]["name"] if saved else None
        phase, repeat = self._phase(saved)
        self.stream = TokenStream(self.orders, phase, repeat)
        self.state.samples_consumed = int(saved["sequences"]) if saved else 0
        return phase if saved and phase.name != previous else None


def _fingerprint(phase: Phase) -> str:
    return hashlib.sha256(json.dumps([(s.name, s.digest, s.weight) for s in phase.sources]).encode()).hexdigest()[:24]


def metrics_row(position: Mapping[str, Any]) -> dict[str, float]:
    """Per source, for metrics.jsonl and wandb: trained tokens, realized share, epoch."""
    row: dict[str, float] = {}
    for name, s in position["sources"].items():
        row[f"data/{name}/tokens"] = s["tokens"]
        row[f"data/{name}/share"] = s["share"]
        row[f"data/{name}/epoch"] = s["epoch"]
    return row
