"""The state before an update, kept so that the update can be re-run elsewhere and compared.

`KeptState` hooks the optimizer (`register_step_pre_hook`): on the steps it is armed for, it copies
every parameter shard, its optimizer state and its hyperparameters into host buffers just before
`optimizer.step()` (the gradient is still in `.grad` after the step, until the next step's
`zero_grad`). `rerun` applies the same optimizer class to such a copy: an element-wise update of
the same inputs with the same kernels, so on a device of the same kind it gives the same bits, and
a difference means one of the two devices computed (or kept) something wrong.

What this costs is a copy of the shard's weights and optimizer state per armed step (12 bytes a
parameter for AdamW in float32), in host memory; bench/sdc.py measures it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

from resilient_slurm.replica.fingerprint import local
from resilient_slurm.replica.wire import Parcel


@dataclass
class TensorState:
    """One parameter shard as an update needs it: its value, its optimizer state, its group's
    hyperparameters (lr, betas, eps, weight decay, ... at that step)."""

    param: torch.Tensor
    state: dict[str, torch.Tensor]
    hparams: dict[str, Any]


class KeptState:
    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        self.armed = False
        """Copy at the next `optimizer.step()` (the sentinel arms it before the steps it checks)."""
        self.kept: list[TensorState] | None = None
        """The state before the last armed update; None until one was kept."""
        self._host = torch.device("cpu")
        optimizer.register_step_pre_hook(self._keep)

    def _keep(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.armed:
            return
        self.armed = False
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        old = self.kept
        kept = []
        for i, p in enumerate(self.params):
            buffers = old[i] if old is not None and len(old) == len(self.params) else None
            state = {k: v for k, v in optimizer.state.get(p, {}).items() if isinstance(v, torch.Tensor)}
            hparams = {k: v for k, v in groups.get(id(p), {}).items() if k != "params"}
            if hparams.get("foreach") is None and not hparams.get("fused"):
                # The implementation the step chose for this parameter (a DTensor on a GPU: the
                # multi-tensor one), so that a re-run on a plain tensor takes the same kernels.
                hparams["foreach"] = _default_to_fused_or_foreach([p], bool(hparams.get("differentiable")))[1]
            kept.append(TensorState(
                self._copy(local(p), buffers.param if buffers else None),
                {k: self._copy(local(v), buffers.state.get(k) if buffers else None) for k, v in state.items()},
                hparams))
        self.kept = kept

    def _copy(self, t: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
        """Into the buffer of the last armed step when it fits (no allocation per step); pinned
        and asynchronous from a GPU (`settle` waits for it before anything reads the copy)."""
        if into is None or into.shape != t.shape or into.dtype != t.dtype:
            into = torch.empty(t.shape, dtype=t.dtype, device=self._host, pin_memory=t.is_cuda)
        into.copy_(t, non_blocking=t.is_cuda)
        return into

    def settle(self) -> None:
        """The copies of the last armed step are complete."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()


def rerun(optimizer_type: type[torch.optim.Optimizer], before: TensorState, grad: torch.Tensor | None,
          device: torch.device) -> TensorState:
    """The update of one shard from `before` with `grad`, on `device`, by a fresh optimizer of the
    same class and hyperparameters: the shard and its state after it."""
    param = before.param.to(device, copy=True)
    if grad is None:  # a frozen tensor (or one the step did not reach): the update leaves it
        return TensorState(param, {k: v.clone() for k, v in before.state.items()}, before.hparams)
    param.grad = grad.to(device, copy=True)
    optimizer = optimizer_type([{"params": [param], **before.hparams}])  # type: ignore[call-arg]
    if before.state:
        # Adam's `step` lives on the host unless capturable or fused; the rest beside the parameter.
        on_host = not (before.hparams.get("capturable") or before.hparams.get("fused"))
        optimizer.state[param] = {k: v.to("cpu" if k == "step" and on_host else device, copy=True)
                                  for k, v in before.state.items()}
    optimizer.step()
    state = {k: v for k, v in optimizer.state[param].items() if isinstance(v, torch.Tensor)}
    return TensorState(param.detach(), state, before.hparams)


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """This rank's shard of the gradient the last update used (clipped), until the next zero_grad."""
    return None if p.grad is None else local(p.grad)


def to_parcel(items: Sequence[tuple[TensorState, torch.Tensor | None]], meta: dict[str, Any]) -> Parcel:
    """States before an update, with their gradients, to re-run elsewhere (`meta` says what for)."""
    tensors: list[torch.Tensor] = []
    described = []
    for before, grad in items:
        keys = sorted(before.state)
        tensors += [before.param, grad if grad is not None else torch.empty(0)] + [before.state[k] for k in keys]
        described.append({"hparams": before.hparams, "state": keys, "grad": grad is not None})
    return Parcel({**meta, "items": described}, tensors)


def from_parcel(parcel: Parcel) -> list[tuple[TensorState, torch.Tensor | None]]:
    out, at = [], 0
    for item in parcel.meta["items"]:
        keys = item["state"]
        param, grad = parcel.tensors[at], parcel.tensors[at + 1]
        state = dict(zip(keys, parcel.tensors[at + 2:at + 2 + len(keys)]))
        # JSON made the betas a list; the optimizer's own groups hold tuples.
        hparams = {k: tuple(v) if isinstance(v, list) else v for k, v in item["hparams"].items()}
        out.append((TensorState(param, state, hparams), grad if item["grad"] else None))
        at += 2 + len(keys)
    return out
