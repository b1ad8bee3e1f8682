"""Fault injection, configured under `fault.*`: the faults a drill or a test needs on demand."""

from __future__ import annotations

import time

from resilient_slurm.config import FaultConfig

HANG_S = 10**9


class InjectedFault(RuntimeError):
    """Raised by `fault.raise_at_step`: stands for a bug that crashes the same step every time."""


class FaultInjector:
    def __init__(self, cfg: FaultConfig, rank: int, hung_before: bool) -> None:
        self.cfg = cfg
        self.active = not cfg.ranks or rank in cfg.ranks
        self.hung_before = hung_before
        """A hang is transient: once the run's ledger has one, the drill does not hang again."""

    def before_step(self, step: int) -> None:
        """Called as step `step` (1-based) begins."""
        if not self.active:
            return
        if self.cfg.raise_at_step and step == self.cfg.raise_at_step:
            raise InjectedFault(f"injected failure at step {step} (fault.raise_at_step)")
        if self.cfg.hang_at_step and step == self.cfg.hang_at_step and not self.hung_before:
            time.sleep(HANG_S)
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)

    def poisons(self, step: int, position: int, global_batch: int) -> bool:
        """NaN loss for the batch originally scheduled for `fault.nan_at_step`: bad data, not a bad
        step number, so a rollback that skips the data also skips the fault."""
        n = self.cfg.nan_at_step
        return bool(n) and position == (n - 1) * global_batch
