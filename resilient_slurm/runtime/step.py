"""One optimizer step, data-parallel over any number of ranks. Knows nothing of Slurm, Hydra or wandb.

The loss is the mean over every target token of the global batch (all ranks, all micro-batches),
so a step means the same thing whatever the world size and accumulation. Gradients live in one
flat buffer that is summed over ranks with a single all-reduce, with no copies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from resilient_slurm.runtime.distributed import Comm
from resilient_slurm.workload.model import IGNORE_INDEX, token_loss_sum


@dataclass(frozen=True)
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    tokens: int
    """Tokens processed in the global batch (samples x sequence length)."""
    target_tokens: int
    """Tokens the loss is taken over (responses, not prompts or padding)."""
    seconds: float
    compute_s: float
    """This rank's own forward and backward, between the collectives: where a slow GPU shows (the
    collectives make every rank wait for the slowest, so the whole step time cannot tell which)."""


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        comm: Comm,
        grad_clip: float,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.grad_clip = grad_clip
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"parameters must share one dtype for the flat gradient buffer, got {dtypes}")
        self.flat_grad = torch.zeros(sum(p.numel() for p in self.params), dtype=dtypes.pop(), device=comm.device)
        offset = 0
        for p in self.params:
            # Gradients accumulate straight into views of the flat buffer; never set them to None.
            p.grad = self.flat_grad[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], poison: bool = False) -> StepResult:
        """One optimizer step. `poison` (fault injection) makes the loss NaN, like a bad batch does."""
        start = time.perf_counter()
        local_targets = float(sum(int((t != IGNORE_INDEX).sum()) for _, t in micro_batches))
        local_inputs = float(sum(i.numel() for i, _ in micro_batches))
        global_tokens, global_inputs = self.comm.sum_floats([local_targets, local_inputs])
        compute_start = time.perf_counter()
        self.flat_grad.zero_()
        loss_sum = torch.zeros((), dtype=torch.float64)
        self.model.train()
        for inputs, targets in micro_batches:
            inputs, targets = inputs.to(self.comm.device), targets.to(self.comm.device)
            micro_loss = token_loss_sum(self.model(inputs), targets)
            if poison:
                micro_loss = micro_loss * float("nan")
            (micro_loss / global_tokens).backward()
            loss_sum += micro_loss.detach().double().cpu()
        compute_s = time.perf_counter() - compute_start
        self.comm.all_reduce_sum_(self.flat_grad)
        if self.grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        else:
            grad_norm = float(self.flat_grad.norm())
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        (total_loss,) = self.comm.sum_floats([float(loss_sum)])
        return StepResult(
            loss=total_loss / max(global_tokens, 1.0), grad_norm=grad_norm, lr=lr,
            tokens=int(global_inputs), target_tokens=int(global_tokens), seconds=time.perf_counter() - start,
            compute_s=compute_s,
        )
