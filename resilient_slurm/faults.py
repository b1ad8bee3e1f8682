"""Fault injection, configured under `fault.*`: the faults a drill or a test needs on demand."""

from __future__ import annotations

import time

from resilient_slurm.config import FaultConfig


class InjectedFault(RuntimeError):
    """Raised by `fault.raise_at_step`: stands for a bug that crashes the same step every time."""


class FaultInjector:
    def __init__(self, cfg: FaultConfig, rank: int) -> None:
        self.cfg = cfg
        self.active = not cfg.ranks or rank in cfg.ranks

    def before_step(self, step: int) -> None:
        """Called as step `step` (1-based) begins."""
        if not self.active:
            return
        if self.cfg.raise_at_step and step == self.cfg.raise_at_step:
            raise InjectedFault(f"injected failure at step {step} (fault.raise_at_step)")
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)
