"""Gradient clipping by the global norm of every gradient, whatever meshes the parameters live on.

The parameters of one model may sit on several meshes: FSDP2's data-parallel mesh alone, the
(data-parallel, TP) mesh under tensor parallelism, and a pipeline stage holds only its own layers.
DTensor computes a norm over one mesh; norms of different meshes cannot be stacked. So each mesh's
parameters give their norm (a DTensor reduced over that mesh), the squares are added, and with
pipeline stages summed over the pipeline group, so every rank clips by the same global norm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def grad_norm(params: Iterable[torch.Tensor], pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The 2-norm of all gradients of `params` (float32, on their device), over every mesh and
    pipeline stage; parameters without a gradient count as zero."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    norms: list[torch.Tensor] = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1 and pp_group is None:
        return norms[0]  # torch's own clip_grad_norm_, bit for bit
    total = torch.stack([n.float() ** 2 for n in norms]).sum() if norms else torch.zeros(())
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float,
                   pp_group: dist.ProcessGroup | None = None) -> float:
    """Scale the gradients so their global norm is at most `max_norm` (inf: never); the norm
    before clipping."""
    norm = grad_norm(params, pp_group)
    if max_norm != float("inf"):
        torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, norm)
    return float(norm)
