"""Heal a shard from a good copy over the network: its weights and optimizer state, no disk.

Over HSDP's replicate dimension every rank of a shard's group takes part in one broadcast per
tensor from the good replica's rank, which writes the same bits into the others' own storage (the
parameter object, and so the optimizer's and FSDP2's references to it, stay the same). A shard
healed from a buddy's re-run takes the re-run's tensors instead (`adopt`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from resilient_slurm.replica.fingerprint import local
from resilient_slurm.replica.update_rerun import TensorState


def state_tensors(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A parameter's optimizer state tensors, in a fixed order (every replica names the same)."""
    state = optimizer.state.get(p, {})
    return [(k, state[k]) for k in sorted(state) if isinstance(state[k], torch.Tensor)]


def held_tensors(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """What a heal copies, in the same order on every replica: each parameter's local shard, then
    its optimizer state tensors; empty ones left out."""
    for p in params:
        for t in [local(p)] + [local(v) for _, v in state_tensors(optimizer, p)]:
            if t.numel():
                yield t


@torch.no_grad()
def broadcast_shards(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer, src: int,
                     group: dist.ProcessGroup, device: torch.device) -> int:
    """Every parameter shard and its optimizer state from global rank `src` to the rest of `group`;
    the bytes this rank received (or sent)."""
    moved = 0
    for t in held_tensors(params, optimizer):
        # AdamW's `step` stays on the host; NCCL sends only what is on the device.
        staged = t if t.device == device else t.to(device)
        dist.broadcast(staged, src=src, group=group)
        if staged is not t:
            t.copy_(staged)
        moved += t.numel() * t.element_size()
    return moved


@torch.no_grad()
def adopt(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer, good: Sequence[TensorState]) -> None:
    """Write a re-run's shards and optimizer state into this rank's own (the same storage)."""
    for p, g in zip(params, good):
        local(p).copy_(g.param)
        for k, v in state_tensors(optimizer, p):
            local(v).copy_(g.state[k])
