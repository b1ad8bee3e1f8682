"""Replay verification in a running session: rank 0 compares each recomputed step's loss with the
value logged before the failure; every rank acts on what the step's all-reduce agreed.

The comparison and the decisions are `monitor.replay` (pure); here are their inputs (the rows a
resume moved aside, the ledger) and their effects: the `replay_mismatch` and `replay_checked`
events, the copy set aside (`Checkpointer.set_aside`), and a node taken out as a node health
check takes one out (`node_unhealthy` in the ledger, the exclude list, `scontrol drain` when
`health.drain`), after which the attempt ends and the job's restart leaves the node behind.

Which loops it covers: any loop whose `Session.log` rows carry a `loss` that is the same on every
resume of a step (the built-in trainer logs the global mean over all ranks). The built-in trainer
falls back inside its process (`Trainer._replay_fallback`); a user's loop, which owns its step
counter and its data iterator, ends the attempt with `ReplayMismatchError` once the copy is set
aside, and the launcher's next start falls back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from resilient_slurm import ledger
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.load import Restored
from resilient_slurm.config import Config
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import Event, EventLog, read_events
from resilient_slurm.monitor import replay
from resilient_slurm.session.distributed import Comm
from resilient_slurm.slurm import scontrol

log = logging.getLogger("resilient_slurm")


class ReplayMismatchError(RuntimeError):
    """A recomputed step differed from the value logged before the failure, and the attempt ends:
    the next start loads another copy (or, drained, runs without the node)."""


class ReplayVerification:
    def __init__(self, cfg: Config, comm: Comm, events: EventLog, checkpointer: Checkpointer) -> None:
        self.cfg, self.comm, self.events, self.checkpointer = cfg, comm, events, checkpointer
        self.state = replay.Replay()
        self.restored: Restored | None = None
        """Where the state came from (every rank: each sets aside its own copy)."""
        self.hosts: list[str] = []
        self.before_step: int | None = None
        """A fallback loads only checkpoints of earlier steps than this (`replay.Decision`)."""

    @property
    def pending(self) -> bool:
        """Rank 0 found a difference at this step (the step's all-reduce tells every rank)."""
        return self.state.mismatch is not None

    def arm(self, restored: Restored | None, moved: Iterable[Mapping[str, Any]], history: list[Event[Any]]) -> None:
        """After a resume: what the replay must reproduce (rank 0; the others keep `restored`)."""
        self.restored = restored
        self.state = replay.Replay()
        rows = list(moved)
        if restored is None or not rows or self.comm.rank != 0 or not self.cfg.monitor.replay_verify:
            return
        deterministic = self.comm.device.type == "cpu" or self.cfg.train.deterministic
        expected = replay.expectations(rows, history, self.comm.world_size, deterministic)
        self.state.arm(expected)
        if expected.why_not:
            self._checked(restored.train_state.step, not_compared=expected.why_not)

    def check(self, step: int, row: Mapping[str, Any]) -> bool:
        """Rank 0, as a step is logged: False when it differs (it is kept out of metrics.jsonl)."""
        found = self.state.check(step, row)
        if found is not None:
            log.error("step %d recomputed after the restart: %s %r, before the failure %r", step, replay.METRIC,
                      found.got, found.expected)
        return found is None

    def after(self, step: int) -> None:
        """After an agreed step: once every expected step matched, `replay_checked`."""
        if self.state.done(step) and self.restored is not None:
            self._checked(step)
            self.state.clear()

    def decide(self, step: int, in_process: bool) -> bool:
        """Every rank, at a step the all-reduce flagged: rank 0 decides and records, all learn it.
        True: fall back now (the copy is set aside; load with `before_step`), which only the
        built-in trainer does `in_process`; a user's loop ends the attempt instead, raising
        ReplayMismatchError, as does a node taken out. False: train on without comparing."""
        decision: replay.Decision | None = None
        if self.comm.rank == 0:
            decision = self._decide_and_record(step)
        decision = self.comm.all_gather_object(decision)[0]
        assert decision is not None and self.restored is not None
        if decision.action == replay.CONTINUE:
            self.state.clear()
            return False
        if decision.action == replay.DRAIN:
            self._take_out(decision)
            raise ReplayMismatchError(f"step {step}: {decision.reason}; the restart leaves the node out")
        self.checkpointer.set_aside(self.restored)
        self.before_step = decision.before_step
        if not in_process:
            raise ReplayMismatchError(f"step {step} differs from its value before the failure: {decision.reason}; "
                                      f"the next start loads the next copy")
        return True

    def fell_back(self, restored: Restored | None, moved: Iterable[Mapping[str, Any]]) -> None:
        self.restored = restored
        self.state.fell_back(moved)
        if restored is None:
            self.state.clear()

    def _decide_and_record(self, step: int) -> replay.Decision:
        found, restored = self.state.mismatch, self.restored
        assert found is not None and restored is not None
        earlier = [e.details.nodes for e in ledger.select(read_events(self.events.path), ledger.ReplayMismatch)
                   if e.details.action in (replay.DRAIN, replay.CONTINUE)]
        decision = replay.decide(self.state.tries + 1, self.cfg.monitor.replay_max_fallbacks,
                                 restored.train_state.step, restored.source, self.hosts, earlier)
        self.events.emit(ledger.ReplayMismatch(
            metric=replay.METRIC, expected=found.expected, got=found.got, checkpoint=str(restored.path),
            source=restored.source, nodes=self.hosts, action=decision.action, reason=decision.reason), step)
        log.error("replay mismatch at step %d (state from %s, %s): %s", step, restored.path, restored.source,
                  decision.reason)
        return decision

    def _take_out(self, decision: replay.Decision) -> None:
        """The same path as a failed node health check: ledger, exclude list, drain where allowed."""
        if self.comm.rank != 0:
            return
        h = self.cfg.health
        for node in decision.drain:
            reason = f"replay_mismatch: {decision.reason}"
            self.events.emit(ledger.NodeUnhealthy(bad_node=node, action="drain", xid=None, reason=reason, notes=[]),
                             None)
            if self.cfg.cluster.exclude_file:
                exclude_list.add(self.cfg.cluster.exclude_file, node, reason=reason, now=time.time(),
                                 job_id=self.events.context.get("job_id"), ttl_s=h.exclude_ttl_h * 3600.0)
            if h.drain:
                ok, message = scontrol.drain_node(node, f"resilient_slurm: {reason}")
                if not ok:
                    log.warning("could not drain %s: %s", node, message)

    def _checked(self, step: int, not_compared: str | None = None) -> None:
        assert self.restored is not None
        self.events.emit(ledger.ReplayChecked(
            compared=self.state.compared, first=self.state.first, checkpoint=str(self.restored.path),
            source=self.restored.source, fallbacks=self.state.tries, not_compared=not_compared), step)
