"""Fault injection, configured under `fault.*`: the faults a drill or a test needs on demand."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from resilient_slurm.config import FaultConfig
from resilient_slurm.replica.fingerprint import bits, local

HANG_S = 10**9
CUDA_ERROR = "CUDA error: an illegal memory access was encountered"


class InjectedFault(RuntimeError):
    """Raised by `fault.raise_at_step`: stands for a bug that crashes the same step every time."""


class FaultInjector:
    def __init__(self, cfg: FaultConfig, rank: int, hung_before: bool, configured_micro_batch: int,
                 cuda_error_before: bool = False, sdc_before: bool = False) -> None:
        self.cfg = cfg
        self.active = not cfg.ranks or rank in cfg.ranks
        self.flips = bool(cfg.sdc_step) and rank == cfg.sdc_rank and not sdc_before
        """`fault.sdc_step`, once per run: a start after the ledger has its `sdc` does not flip again."""
        self.hung_before = hung_before
        """A hang is transient: once the run's ledger has one, the drill does not hang again."""
        self.cuda_error_before = cuda_error_before
        """So is the CUDA error: once the ledger has its crash, it does not come again."""
        self.configured_micro_batch = configured_micro_batch
        self.oom_armed = False
        self.leaked: list[bytes] = []

    def attach(self, model: nn.Module) -> None:
        """`fault.oom_at_step` raises inside the middle decoder layer, after FSDP2 gathered its
        weights, where a real activation allocation would fail."""
        if self.active and self.cfg.oom_at_step:
            layers = model.get_submodule("model.layers")
            assert isinstance(layers, nn.ModuleDict)
            held = list(layers.values())  # this rank's layers: a pipeline stage holds some of them
            held[len(held) // 2].register_forward_pre_hook(self._out_of_memory)

    def before_step(self, step: int, micro_batch: int) -> None:
        """Called as step `step` (1-based) begins, with the micro-batch it runs at."""
        if not self.active:
            return
        if self.cfg.raise_at_step and step == self.cfg.raise_at_step:
            raise InjectedFault(f"injected failure at step {step} (fault.raise_at_step)")
        if self.cfg.cuda_error_at_step and step == self.cfg.cuda_error_at_step and not self.cuda_error_before:
            raise RuntimeError(f"{CUDA_ERROR} (fault.cuda_error_at_step)")
        if self.cfg.hang_at_step and step == self.cfg.hang_at_step and not self.hung_before:
            time.sleep(HANG_S)
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)
        if self.cfg.leak_mb_per_step:
            self.leaked.append(b"\1" * int(self.cfg.leak_mb_per_step * 2**20))  # written, so resident
        # The step fits at any smaller micro-batch: the retry, and later starts that kept it, pass.
        self.oom_armed = step == self.cfg.oom_at_step and micro_batch == self.configured_micro_batch

    @torch.no_grad()
    def after_update(self, step: int, model: nn.Module) -> None:
        """`fault.sdc_step`: flip the lowest bit of the first element of this rank's first non-empty
        parameter shard, after the step's update (the bit flip in memory a real one would be)."""
        if not (self.flips and step == self.cfg.sdc_step):
            return
        for p in model.parameters():
            shard = bits(local(p))
            if shard.numel():
                shard[0] ^= 1
                return

    def poisons(self, step: int, position: int, global_batch: int) -> bool:
        """NaN loss for the batch originally scheduled for `fault.nan_at_step`: bad data, not a bad
        step number, so a rollback that skips the data also skips the fault."""
        n = self.cfg.nan_at_step
        return bool(n) and position == (n - 1) * global_batch

    def _out_of_memory(self, module: nn.Module, args: Any) -> None:
        if self.oom_armed and torch.is_grad_enabled():
            self.oom_armed = False
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: fault.oom_at_step={self.cfg.oom_at_step})")
