"""A deterministic SFT-style dataset that needs no download, and a sampler with an exact position.

Each sample is a small instruction task (copy, reverse, sort or increment a list of item tokens),
generated from `(seed, split, index)` alone, so any sample can be produced on any rank at any time.
The prompt is masked out of the loss; only the response (and its EOS) is trained on.

The sampler's whole state is one integer, `samples_consumed`: the global sample stream is a fixed
function of the seed, global batch `k` is stream positions `[k*G, (k+1)*G)`, and ranks take
disjoint slices of it. A checkpoint stores that integer, so a resumed run neither replays nor skips
a batch, whatever the world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resilient_slurm.config import TASKS, DataConfig
from resilient_slurm.workload.model import IGNORE_INDEX

PAD, BOS, EOS, SEP = 0, 1, 2, 3
TASK_TOKEN = {task: 4 + i for i, task in enumerate(TASKS)}
FIRST_ITEM = 16
NUM_ITEMS = 32
TRAIN_SPLIT, VAL_SPLIT = 0, 1


@dataclass(frozen=True)
class Sample:
    prompt: list[int]
    response: list[int]
    task: str


def make_sample(cfg: DataConfig, seed: int, split: int, index: int) -> Sample:
    """Sample `index` of a split; a pure function of its arguments."""
    rng = np.random.default_rng([seed, split, index])
    tasks = sorted(cfg.mix)
    weights = np.array([cfg.mix[t] for t in tasks], dtype=np.float64)
    task = tasks[int(rng.choice(len(tasks), p=weights / weights.sum()))]
    n = int(rng.integers(cfg.min_items, cfg.max_items + 1))
    items = [int(v) for v in rng.integers(0, NUM_ITEMS, size=n)]
    if task == "copy":
        out = items
    elif task == "reverse":
        out = items[::-1]
    elif task == "sort":
        out = sorted(items)
    else:
        out = [(v + 1) % NUM_ITEMS for v in items]
    prompt = [BOS, TASK_TOKEN[task]] + [FIRST_ITEM + v for v in items] + [SEP]
    response = [FIRST_ITEM + v for v in out] + [EOS]
    return Sample(prompt=prompt, response=response, task=task)


def collate(samples: list[Sample], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (batch, seq_len); targets are IGNORE_INDEX outside responses."""
    inputs = torch.full((len(samples), seq_len), PAD, dtype=torch.long)
    targets = torch.full((len(samples), seq_len), IGNORE_INDEX, dtype=torch.long)
    for row, s in enumerate(samples):
        tokens = s.prompt + s.response
        n = min(len(tokens), seq_len + 1)
        inputs[row, : n - 1] = torch.tensor(tokens[: n - 1])
        # Position t predicts token t+1; only response tokens are targets.
        first_target = len(s.prompt) - 1
        targets[row, first_target : n - 1] = torch.tensor(tokens[first_target + 1 : n])
    return inputs, targets


class SampleStream:
    """The global order of training samples: a fresh permutation of the dataset every epoch."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def indices(self, start: int, count: int) -> list[int]:
        """Dataset indices at stream positions [start, start + count)."""
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


class GlobalBatchSampler:
    """Hands each rank its micro-batches of the next global batch; the position is exact."""

    def __init__(self, cfg: DataConfig, seed: int, rank: int, world_size: int) -> None:
        if cfg.global_batch_size % (cfg.micro_batch_size * world_size):
            raise ValueError(
                f"data.global_batch_size={cfg.global_batch_size} is not a multiple of "
                f"micro_batch_size*world_size={cfg.micro_batch_size * world_size}"
            )
        self.cfg = cfg
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.accumulation = cfg.global_batch_size // (cfg.micro_batch_size * world_size)
        self.stream = SampleStream(cfg.num_samples, seed)
        self.state = SamplerState()

    @property
    def epoch(self) -> int:
        return self.state.samples_consumed // self.cfg.num_samples

    def rank_indices(self, global_indices: list[int]) -> list[list[int]]:
        return rank_micro_batches(global_indices, self.cfg.micro_batch_size, self.world_size, self.rank,
                                  self.accumulation)

    def next_batch(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of the next global batch, and advance the position."""
        g = self.cfg.global_batch_size
        global_indices = self.stream.indices(self.state.samples_consumed, g)
        self.state.samples_consumed += g
        return [
            collate([make_sample(self.cfg, self.seed, TRAIN_SPLIT, i) for i in micro], self.cfg.seq_len)
            for micro in self.rank_indices(global_indices)
        ]
