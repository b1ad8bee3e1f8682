"""What a step adds up over the live replica groups: a few numbers, and the gradients.

Each rank adds with the ranks of the same place in the other groups, which hold the same shards of
every gradient (the groups are laid out alike), so a sum of local shards is the sum of the whole
gradients. One flat buffer per gradient dtype makes it one reduction, not one per parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

from resilient_slurm.replica.engine import Replicas


def sum_floats(replicas: Replicas, values: Sequence[float]) -> list[float]:
    """Element-wise sum over the live groups (float64, on the CPU). After a failed reduction the
    values are not to be used: `replicas.errored()` says so."""
    t = torch.tensor(list(values), dtype=torch.float64)
    replicas.sum_(t)
    return t.tolist()


def sum_gradients(replicas: Replicas, params: Sequence[torch.Tensor]) -> None:
    """Every parameter's gradient (its local shard) summed over the live groups, in place."""
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        replicas.sum_(flat)
        if replicas.errored():
            return
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
