"""Packed rows as training batches, and the exact-position sampler over them.

The sampler's whole state is one integer, `samples_consumed` (rows consumed, over all ranks): the
global row stream is a fixed function of the seed (a fresh permutation of the rows each epoch),
global batch k is stream positions [k*G, (k+1)*G), and micro-batch m of rank r is chunk m*world+r
of it. A checkpoint stores that integer, and the rows were packed once, when the cache was built,
so a resumed run neither replays nor skips a row, whatever the world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from resilient_slurm.config import DataConfig
from resilient_slurm.data.packing import labels_and_positions


@dataclass(frozen=True)
class Batch:
    """Rows of packed documents, each tensor (rows, seq_len), int64."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    """Already shifted: labels[:, t] is the target at t (token t+1), or -100 where there is no loss."""
    position_ids: torch.Tensor
    """Restart at 0 at each document."""
    document_ids: torch.Tensor
    """Index of each token's document within its row; -1 for padding."""

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in
                       (self.input_ids, self.labels, self.position_ids, self.document_ids)))


class PackedRows:
    """One split's rows (numpy arrays, memory-mapped from the cache)."""

    def __init__(self, tokens: np.ndarray, docs: np.ndarray, loss: np.ndarray) -> None:
        self.tokens, self.docs, self.loss = tokens, docs, loss

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def batch(self, rows: Sequence[int]) -> Batch:
        index = np.asarray(rows, dtype=np.int64)
        tokens, docs = self.tokens[index].astype(np.int64), self.docs[index].astype(np.int64)
        labels, positions = labels_and_positions(tokens, docs, self.loss[index])
        return Batch(*(torch.from_numpy(a) for a in (tokens, labels, positions, docs)))


class SampleStream:
    """The global order of training rows: a fresh permutation of them every epoch."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def indices(self, start: int, count: int) -> list[int]:
        """Row indices at stream positions [start, start + count)."""
        out: list[int] = []
        pos = start
        while len(out) < count:
            epoch, offset = divmod(pos, self.num_samples)
            if epoch != self._epoch:
                self._perm = np.random.default_rng([self.seed, epoch, 7]).permutation(self.num_samples)
                self._epoch = epoch
            take = min(count - len(out), self.num_samples - offset)
            out.extend(int(i) for i in self._perm[offset : offset + take])
            pos += take
        return out


def rank_micro_batches(global_indices: list[int], micro: int, world_size: int, rank: int,
                       accumulation: int) -> list[list[int]]:
    """A rank's micro-batches of one global batch: micro-batch m of rank r is chunk m*world+r."""
    chunks = [global_indices[i : i + micro] for i in range(0, len(global_indices), micro)]
    return [chunks[m * world_size + rank] for m in range(accumulation)]


@dataclass
class SamplerState:
    samples_consumed: int = 0


class PackedBatchSampler:
    """Hands each rank its micro-batches of the next global batch of rows; the position is exact.

    The micro-batch may shrink during a run (a step that ran out of device memory is redone at a
    smaller one, `batch_at` the same position); the global batch, and so each step, stays the same.
    """

    def __init__(self, rows: PackedRows, cfg: DataConfig, seed: int, rank: int, world_size: int) -> None:
        self.rows = rows
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.stream = SampleStream(rows.num_rows, seed)
        self.state = SamplerState()
        self.micro_batch_size = cfg.micro_batch_size
        self.accumulation = 0
        self.set_micro_batch_size(cfg.micro_batch_size)

    @property
    def epoch(self) -> int:
        return self.state.samples_consumed // self.rows.num_rows

    @property
    def rows_per_rank(self) -> int:
        return self.cfg.global_batch_size // self.world_size

    def set_micro_batch_size(self, micro: int) -> None:
        if self.cfg.global_batch_size % (micro * self.world_size):
            raise ValueError(
                f"data.global_batch_size={self.cfg.global_batch_size} is not a multiple of "
                f"micro_batch_size*world_size={micro * self.world_size}"
            )
        self.micro_batch_size = micro
        self.accumulation = self.cfg.global_batch_size // (micro * self.world_size)

    def rank_indices(self, global_indices: list[int], rank: int | None = None) -> list[list[int]]:
        return rank_micro_batches(global_indices, self.micro_batch_size, self.world_size,
                                  self.rank if rank is None else rank, self.accumulation)

    def batch_at(self, position: int, rank: int | None = None) -> list[Batch]:
        """This rank's micro-batches of the global batch at stream `position` (or data-parallel rank
        `rank`'s: a replica group computing a missing group's share)."""
        global_indices = self.stream.indices(position, self.cfg.global_batch_size)
        return [self.rows.batch(micro) for micro in self.rank_indices(global_indices, rank)]

    def next_batch(self) -> list[Batch]:
        """This rank's micro-batches of the next global batch, and advance the position."""
        batch = self.batch_at(self.state.samples_consumed)
        self.state.samples_consumed += self.cfg.global_batch_size
        return batch
