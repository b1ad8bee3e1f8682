"""A user's loop written from the README alone, unlike examples/own_loop: DDP instead of FSDP2, a
DataLoader over a DistributedSampler, gradient accumulation, two parameter groups, dropout, and the
loss handed to `s.log` as the tensor it is. Once plain (`plain`, started torchrun-style with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), once with a Session (`with_session`, an `entry=` function).

The data position is the loop's own: micro-batches consumed, from which the epoch and the offset in
it follow. The DataLoader gets a generator of its own: each `iter(loader)` draws a seed from it, and
from torch's global generator without one, which would move the dropout masks after a resume
mid-epoch (the README says so).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED, STEPS, ACCUMULATION, MICRO_BATCH, SAMPLES = 11, 40, 2, 8, 512
PAUSE_AT = "DDP_LOOP_PAUSE_AT"
"""The test's hook, not the user's: every rank waits at this step until the stop signal reached it."""
PAUSED = "DDP_LOOP_PAUSED"
"""The file rank 0 creates once every rank waits there."""


def parts() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, DataLoader]:
    """The model (DDP), its optimizer with two parameter groups, the warmup, the loader: alike in both loops."""
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(-1)
    sampler: DistributedSampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=SEED)
    loader = DataLoader(sampler.dataset, batch_size=MICRO_BATCH, sampler=sampler, drop_last=True,
                        generator=torch.Generator())
    return model, opt, sched, loader


class Position:
    """Micro-batches consumed: the epoch and the offset in it follow from it."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.consumed = loader, 0

    def batches(self) -> Iterator[Any]:
        """The micro-batches from here on, across epochs."""
        while True:
            epoch, offset = divmod(self.consumed, len(self.loader))
            self.loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for i, batch in enumerate(self.loader):
                if i >= offset:
                    self.consumed += 1
                    yield batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = state["consumed"]


def step(model: nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
         batches: Iterator[Any]) -> torch.Tensor:
    """One optimizer step over ACCUMULATION micro-batches, gradients all-reduced on the last only."""
    total = torch.zeros(())
    for m in range(ACCUMULATION):
        x, y = next(batches)
        last = m == ACCUMULATION - 1
        with model.no_sync() if not last else nullcontext():  # type: ignore[operator]
            loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATION
            loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    return total


def plain(out: str) -> None:
    """The loop as its author wrote it; rank 0 writes the final weights to `out` (safetensors)."""
    from safetensors.torch import save_file

    dist.init_process_group("gloo")
    model, opt, sched, loader = parts()
    batches = Position(loader).batches()
    for _ in range(1, STEPS + 1):
        step(model, opt, sched, batches)
    if dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    dist.destroy_process_group()


def with_session(cfg: Any) -> None:
    """The same loop with a Session: the data position registered, the loss logged as a tensor."""
    from resilient_slurm.api import Session

    dist.init_process_group("gloo")
    model, opt, sched, loader = parts()
    position = Position(loader)
    with Session.from_env(model, opt, sched, position) as s:
        s.resume()
        batches = position.batches()
        for n in s.steps(STEPS):
            loss = step(model, opt, sched, batches)
            s.log(n, loss=loss, tokens=MICRO_BATCH * ACCUMULATION * dist.get_world_size())
            if n == int(os.environ.get(PAUSE_AT, "0")):
                _wait_for_the_stop_signal()
            if s.end_of_step(n):
                break
    dist.destroy_process_group()


def _wait_for_the_stop_signal() -> None:
    """The steps take a millisecond: the test's signal must find the loop at a known step. Every rank
    waits on its own stop request (the launcher's, which the Session's handlers set), after rank 0
    told the test where they stand."""
    from resilient_slurm.session.context import current

    dist.barrier()
    if dist.get_rank() == 0:
        Path(os.environ[PAUSED]).touch()
    while not current().stop.requested:  # type: ignore[union-attr]
        time.sleep(0.01)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    plain(sys.argv[1])
