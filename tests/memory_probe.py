"""What a real sharded model holds, measured, for checking `parallel/estimate.py` (`launch --plan`).

- static state: the bytes of each rank's local part of every parameter, of every gradient after a
  step, and of every AdamW state tensor after it (DTensors counted by their local tensor);
- activations: what autograd saves for the backward of one micro-batch (the forward and the loss),
  recorded with `torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters left out
  (FSDP2's gathered weights; their memory is the estimate's transients, not activations).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from resilient_slurm.data.batches import Batch
from resilient_slurm.model.decoder import token_loss_sum


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t._local_tensor if isinstance(t, DTensor) else t
    # Under sequence parallelism a reduce-scatter's output is an AsyncCollectiveTensor: a wrapper with
    # no storage of its own around the tensor that holds the bytes.
    return t.trigger_wait() if isinstance(t, AsyncCollectiveTensor) else t


@dataclass(frozen=True)
class Static:
    params: int
    grads: int
    optimizer: int


def static_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> Static:
    """After at least one optimizer step (gradients and AdamW state exist)."""
    params = sum(_local(p).nbytes for p in model.parameters())
    grads = sum(_local(p.grad).nbytes for p in model.parameters() if p.grad is not None)
    state = sum(_local(v).nbytes for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return Static(params, grads, state)


def saved_bytes(model: nn.Module, batch: Batch, vocab_parallel: bool) -> int:
    """Bytes one micro-batch's forward and loss save for the backward; the backward then runs, and
    its gradients are left on the model."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        weights = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        if storage.data_ptr() not in weights:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    model.train()
    with loss_parallel() if vocab_parallel else contextlib.nullcontext():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = token_loss_sum(model(batch.input_ids, batch.position_ids, batch.document_ids), batch.labels)
        loss.backward()
    return sum(seen.values())
