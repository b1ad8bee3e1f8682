"""The simulated run's saves: when each falls due, the disk tiers' (sync or async) and the memory
tier's, what they block, their commits, and the Young-Daly interval they feed. Pure.

A part of `engine.Run` (its base class): the state it reads and writes is declared here, and set
by `Run.__init__`; the engine's loop calls these handlers when their time comes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from resilient_slurm.checkpoint.interval import Interval
from resilient_slurm.checkpoint.policy import SaveClock, next_due_s
from resilient_slurm.simulate.history import Ledger
from resilient_slurm.simulate.memory import MemoryTier
from resilient_slurm.simulate.scenario import Scenario, Strategy
from resilient_slurm.simulate.tiers import Tiers
from resilient_slurm.slurm import placement
from resilient_slurm.slurm.placement import Allocation

INF = float("inf")


class Saving(ABC):
    s: Scenario
    st: Strategy
    t: float
    work: float
    target: int
    alloc: Allocation
    ledger: Ledger
    tiers: Tiers
    memory: MemoryTier | None
    clock: SaveClock
    interval: Interval | None
    saves: int
    save_at: float
    blocked_until: float
    blocked_by: str
    pending: tuple[float, float, int] | None
    sync_save: tuple[float, int] | None
    after_save: str | None
    grow: placement.Placement | None
    commits: list[tuple[float, float]]
    """Every committed disk save: (when, work)."""

    @abstractmethod
    def _update_interval(self) -> None:
        """After each save and at each resume: the Young-Daly interval (in the engine, whose
        `mtbf_s` and `save_costs` the decision tests watch)."""

    @abstractmethod
    def _mtbf_s(self) -> float:
        """The MTBF of the failures seen so far."""

    def _interval_s(self) -> float:
        if self.st.saves == "fixed":
            return self.s.interval_min * 60.0
        return self.interval.seconds if self.interval else self.s.min_interval_s

    def _schedule_save(self) -> None:
        due = next_due_s(self.clock, self._interval_s()) if self.st.saves != "none" else None
        self.save_at = INF if due is None else due

    def _on_save_due(self) -> None:
        if self.t < self.blocked_until:  # a memory-tier save holds the loop: right after it
            self.save_at = self.blocked_until
            return
        if self.pending is not None:  # checkpoint.if_busy=wait: the loop waits for the save in flight
            self.blocked_until = self.save_at = self.pending[0]
            self.blocked_by = "checkpoint"
            return
        grow = self._grow_back()
        if grow is not None or not self.st.async_saves:
            self.grow = grow
            self.after_save = "grow" if grow else None
            self._save_sync()
            return
        step = self._step()
        self.clock = SaveClock(step, self.t)
        self.pending = (self.t + self.s.save_s, self.work, step)
        self.blocked_until, self.blocked_by = self.t + self.s.blocking_s, "checkpoint"
        self._schedule_save()

    def _save_sync(self) -> None:
        self.sync_save = (self.work, self._step())
        self.blocked_until, self.blocked_by = self.t + self.s.save_s, "checkpoint"
        self.save_at = INF

    def _on_commit(self) -> None:
        assert self.pending is not None
        _, work, step = self.pending
        self.pending = None
        self._commit(work, step, blocking_s=self.s.blocking_s)
        self._schedule_save()

    def _commit(self, work: float, step: int, blocking_s: float) -> None:
        self.tiers.commit(self.t, work, step)
        self.commits.append((self.t, work))
        self.saves += 1
        self.ledger.save(self.t, step, self.s.save_s, blocking_s, self.s.ckpt_bytes)
        self._update_interval()

    def _on_memory_due(self) -> None:
        assert self.memory is not None
        later = self.memory.busy_until(self.t, self.blocked_until)
        if later is not None:
            self.memory.due_at = later
            return
        self.blocked_until = self.memory.take(self.t, self.work, self._step(), self.alloc.in_use)
        self.blocked_by = "memory_checkpoint"

    def _on_memory_commit(self) -> None:
        assert self.memory is not None
        saved = self.memory.commit()
        self.ledger.save(self.t, saved.step, self.s.memory_save_s, self.s.memory_blocking_s, self.s.ckpt_bytes,
                         memory=True)

    def _grow_back(self) -> placement.Placement | None:
        if not self.st.elastic or len(self.alloc.in_use) >= self.target or not self.alloc.spares:
            return None
        cost = self.s.save_s + self.s.in_alloc_restart_s + self.s.load_s
        return placement.grow_back(self.alloc, cost, self._mtbf_s())

    def _step(self) -> int:
        return int(self.work / self.s.step_s)
