"""What one rank holds that the sentinel checks, and how it reaches the others."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resilient_slurm.replica.fingerprint import fingerprints
from resilient_slurm.replica.update_rerun import KeptState, TensorState, grad_of, rerun
from resilient_slurm.replica.verdict import Fingerprint
from resilient_slurm.session.distributed import Comm


@dataclass
class Holder:
    comm: Comm
    names: list[str]
    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    kept: KeptState | None
    """The state before the checked update (None: none kept)."""
    nodes: list[str]
    """Every rank's node."""

    def rows(self, tensors: list[torch.Tensor]) -> tuple[Fingerprint, ...]:
        return tuple((int(a), int(b)) for a, b in fingerprints(tensors).tolist())

    def before(self, indices: tuple[int, ...]) -> list[TensorState]:
        assert self.kept is not None and self.kept.kept is not None
        self.kept.settle()
        return [self.kept.kept[i] for i in indices]

    def grads(self, indices: tuple[int, ...]) -> list[torch.Tensor | None]:
        return [grad_of(self.params[i]) for i in indices]

    def rerun(self, items: list[tuple[TensorState, torch.Tensor | None]]) -> list[TensorState]:
        """The update of each item, re-run on this rank's device."""
        return [rerun(type(self.optimizer), before, grad, self.comm.device) for before, grad in items]
