"""The resilience layer of one rank, for any training loop: the built-in trainer's and a user's own.

A `Session` holds what keeps a run alive and nothing of what it trains: the run directory and its
ledger, the stop request that signals set, the checkpointer (periodic, time-based and emergency
saves, retention, tiers, resume), `metrics.jsonl` and the tracker (committed steps only), the hang
watchdog and the GPU sampler. Its user registers the state to save (a model, an optimizer, a
scheduler, a data position; `resume.py`) and calls it at three points: `resume()` before the first
step, `log(step, ...)` with the step's metrics, `end_of_step(step)` after it. Every rank calls them
at the same steps: the end of a step agrees the stop across ranks in one small all-reduce
(`step_sync.py`), so every rank saves the same step, and a stop never cuts a step in half.

A loop's face is narrow: `from_env`, `resume`, `steps`, `log`, `end_of_step`, `save`, `close`, and
the few properties a loop reads (`rank`, `world_size`, `device`, `step`, `model`, `optimizer`,
`scheduler`). The built-in trainer (trainer/trainer.py) builds its own Session and uses the halves
of `end_of_step` (`sync`, `advance`, `after_step`), because its monitor acts between them, and a
few more methods of its own (listed under "the built-in trainer's side" below).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from resilient_slurm import ledger
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.load import Refusal, Restored
from resilient_slurm.checkpoint.state import Snapshot, capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.console import LOG_ONLY
from resilient_slurm.errors import InputError, exit_code_for
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import EventLog
from resilient_slurm.monitor.gpu_sampler import GpuSampler
from resilient_slurm.process.signals import StopRequest, install_stop_handlers
from resilient_slurm.rundir import RunDir, record
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.rundir.meta import read_identity
from resilient_slurm.rundir.metrics import MetricsFile
from resilient_slurm.session import rejoin
from resilient_slurm.session.context import RankContext, RunOutcome, current
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.session.heartbeat import Heartbeat
from resilient_slurm.session.replay import ReplayVerification
from resilient_slurm.session.logs import setup_logging
from resilient_slurm.session.sections import StepSections
from resilient_slurm.session.resume import Registered, Stateful, load_newest
from resilient_slurm.session.step_record import line_due, metric_row, missed_end_of_step, never_ended, step_line
from resilient_slurm.session.step_sync import Progress, StepSync
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.session.watchdog import Watchdog
from resilient_slurm.tracking import open_tracker

log = logging.getLogger("resilient_slurm")


class Session:
    """One rank's resilience. Use it as a context manager (`with Session.from_env(...) as s:`), or,
    as the built-in trainer does, through `start()` and `close(code)`."""

    def __init__(self, cfg: Config, run_dir: Path, comm: Comm, stop: StopRequest, events: EventLog,
                 state: Registered, *, stamp: dict[str, Any] | None = None, total_steps: int | None = None,
                 refusal: Refusal | None = None, reinitialise: Callable[[], None] | None = None,
                 on_hang: Callable[[int, str], None] | None = None, owns_comm: bool = False,
                 context: RankContext | None = None) -> None:
        self._cfg, self._comm, self._stop, self._events, self._state = cfg, comm, stop, events, state
        self.run_dir = run_dir
        self.paths = RunDir(run_dir)
        self._stamp = stamp or {}
        """Fields every train_state.json of this run holds (a LoRA run's adapters and base model)."""
        self._total = total_steps
        self._refusal = refusal
        self._reinitialise = reinitialise
        """Puts back what a fresh start has, after a damaged checkpoint was partly read into the state."""
        self._owns_comm = owns_comm
        self._context = context
        self._identity = read_identity(run_dir)
        self._checkpointer = Checkpointer(run_dir, cfg.checkpoint, cfg.cluster, comm, events)
        self._metrics = MetricsFile(self.paths.metrics) if comm.rank == 0 else None
        self._tracker = open_tracker(cfg, run_dir, comm.global_rank)
        self._watchdog = Watchdog(cfg.monitor, self.paths.logs, events, comm.global_rank, on_hang or (lambda s, r: None),
                                  ExitCode.FAILED)
        self._gpu = GpuSampler(comm.local_rank, cfg.monitor.gpu_sample_s)
        self._heartbeat = Heartbeat.from_env(comm.global_rank, rejoin.generation())
        self._replay = ReplayVerification(cfg, comm, events, self._checkpointer)
        g = comm.replica
        self.speaks = comm.rank == 0 and (g is None or (g.group == 0 and not g.heal))
        """Records the attempt itself (start, resume, data): rank 0 (of group 0 and not a replacement)."""
        self.leads = True
        """Its group writes the step records (metrics, saves, finish): with replica groups, the lowest
        live one, which the trainer sets at every quorum."""
        self._progress = Progress()
        self._tracked_through = -1
        self._stopped = False
        """A stop request ended the run at a step boundary (saved): launch again to resume."""
        self._last_end = time.perf_counter()
        self._pending_tokens = 0
        self._reached = 0
        """The furthest step the loop began (handed out by `steps`, or logged)."""
        self._ended_any = False
        """`end_of_step` (or the trainer's `advance`) ran in this attempt."""

    # --- the loop's face --------------------------------------------------------------------------
    @classmethod
    def from_env(cls, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 data_state: Stateful | dict[str, Any] | None = None, *, run_dir: str | Path | None = None) -> Session:
        """A session for the rank this process is, in the run the launcher prepared: the launcher's
        own context when `python -m resilient_slurm.launch entry=...` started this function,
        otherwise the run directory (`run_dir`, or the launcher's `RankLaunch.run_dir`) and torchrun-style
        variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A process group the
        loop already made is adopted (and left open at the end); otherwise one is made.

        `data_state` is the data position: an object with `state_dict()` and `load_state_dict()`,
        or a dict, saved as JSON. What cannot be saved is refused here, in one line (an InputError)."""
        state = Registered(model, optimizer, scheduler, data_state)
        ctx = current()
        if ctx is not None:
            cfg, path, info, stop, context, on_hang = ctx.cfg, ctx.run_dir, ctx.info, ctx.stop, ctx.context, ctx.on_hang
        else:
            where = run_dir or RankLaunch.from_env(os.environ).run_dir
            if not where:
                raise InputError(f"no run directory: start the loop with python -m resilient_slurm.launch entry=MODULE:FN, "
                                 f"or pass run_dir= (or set {RankLaunch.variable('run_dir')}) to one the launcher prepared")
            path, info, stop, context, on_hang = Path(where), RankInfo.from_env(), install_stop_handlers(), {}, None
            cfg = load_config(path)
            setup_logging(path, info.rank)
        adopted = torch.distributed.is_initialized()
        comm = Comm.adopt() if adopted else Comm(info, cfg.cluster.backend, cfg.cluster.collective_timeout_s)
        events = EventLog(RunDir(path).events, rank=comm.rank, context=context)
        return cls(cfg, path, comm, stop, events, state, on_hang=on_hang, owns_comm=not adopted, context=ctx)

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Done: the final save and `finish`. Stopped: exit status 75, launch again to resume. An
        exception: recorded, and on its way (`errors.exit_code_for`: 2 for bad input, 1 otherwise).
        A loop that ran steps without ever calling `end_of_step` is refused (exit status 2):
        finishing would keep nothing of them."""
        if exc is None and not self._stopped and self._reached > self._progress.step and not self._ended_any:
            refused = InputError(never_ended(self._reached))
            self._crashed(refused)
            self.close(ExitCode.CONFIG)
            raise refused
        if exc is not None:
            self._crashed(exc)
            self.close(exit_code_for(exc))
            return
        if not self._stopped:
            self.finish()
        self.close(ExitCode.RESUME if self._stopped else ExitCode.DONE)
        if self._stopped:
            raise SystemExit(int(ExitCode.RESUME))

    def resume(self) -> TrainState | None:
        """Load the newest checkpoint that verifies into everything registered; its train state,
        or None on a fresh start. Metrics of steps after it are moved aside (they are redone).
        Random generators: a resume restores each rank's saved states, and a fresh start leaves
        them as the loop seeded them."""
        began = time.perf_counter()
        self.announce("load")
        restored = load_newest(self._checkpointer, self._state, self._comm.rank, self._events, self._refusal,
                               self._reinitialise)
        load_s = time.perf_counter() - began
        step = restored.train_state.step if restored else 0
        if restored is not None:
            self._come_back(restored.train_state)
        self._checkpointer.restart_clock(step)
        self._last_end = time.perf_counter()
        moved = self._metrics.truncate_after(step) if self._metrics and self._comm.replica is None else []
        if restored is not None and self.speaks:
            self._events.emit(ledger.Resume(checkpoint=str(restored.path), has_optimizer=restored.has_optimizer,
                                            source=restored.source, saved_world_size=restored.saved_world_size,
                                            seconds=round(load_s, 3)), step)
            log.info("resumed from %s (step %d)", restored.path, step)
        self._replay.arm(restored, moved, self._checkpointer.ledger)
        return restored.train_state if restored else None

    def resumed_at(self, step: int) -> None:
        """The step the replica groups' first quorum agreed on: metrics after it go (`resume` left them)."""
        if self._metrics is not None and self.leads:
            self._metrics.truncate_after(step)

    def adopt(self, ts: TrainState) -> None:
        """A state from elsewhere (a replica group healed from a live one), taken as a resume takes one."""
        self._come_back(ts)
        self._checkpointer.restart_clock(ts.step)
        self._last_end = time.perf_counter()

    def steps(self, max_steps: int) -> Iterator[int]:
        """The steps still to run: from the resumed step + 1 to `max_steps`, the run's total (the
        console's `step 5/200`, the report's `finished at step 200/200`). A loop that reaches a
        step without calling `end_of_step` for the one before is stopped there, in one line."""
        self._total = max_steps
        return self._steps(self._progress.step + 1, max_steps)

    def _steps(self, first: int, last: int) -> Iterator[int]:
        for step in range(first, last + 1):
            if step > first:
                self._require_ended(step, "s.steps")
            self._reached = max(self._reached, step)
            yield step

    def log(self, step: int, values: dict[str, Any] | None = None, **more: Any) -> None:
        """One step's metrics: a line of metrics.jsonl (rank 0) and the tracker, which sends only
        steps a durable checkpoint covers; the console's step line at `train.log_every_steps`.
        Numbers, strings, 0-dim tensors and numpy scalars (each becomes its number); anything else
        is refused on every rank alike, in one line naming the metric. `tokens` (this step's, over
        all ranks) counts towards `tokens_seen`."""
        self._require_ended(step, "s.log")
        self._reached = max(self._reached, step)
        row = metric_row(step, {**(values or {}), **more})
        # The report counts productive time from it: a loop that does not time its steps gets the
        # time since the last step ended.
        row.setdefault("step_seconds", time.perf_counter() - self._last_end)
        self._pending_tokens = int(row.get("tokens", 0) or 0)
        if self._metrics and not self._replay.check(step, row):
            return  # a recomputed step that differs: in the replay_mismatch event, never in the metrics
        if self._metrics and self.leads:
            self._metrics.append(row)
        self._tracker.log(step, row)
        if self._comm.rank == 0 and line_due(step, self._cfg.train.log_every_steps):
            log.info("%s", step_line(step, self._total, row))

    def end_of_step(self, step: int) -> bool:
        """After every step, on every rank: agree on a stop, save if a policy (or the stop) says
        so. True: stop now (the emergency checkpoint is written); the `with` block then exits 75."""
        now = time.perf_counter()
        step_s, self._last_end = now - self._last_end, now
        self.advance(step, self._pending_tokens, step_s)
        self._pending_tokens = 0
        sync = self.sync(step, step_s)
        if sync.replay_mismatch:
            self._replay.decide(step, in_process=False)
        return self.after_step(step, sync)

    def save(self, step: int, reason: str = "requested") -> None:
        """Save `step` now (every rank, at the same step), besides what the policies save."""
        if not self.leads:  # another replica group saves the same state
            return
        self.announce("save")
        self._checkpointer.save(step, self._snapshot(reason), reason)
        self._heartbeat.beat(step)
        self.commit()

    def close(self, code: ExitCode) -> None:
        """On every exit path: the save in flight finishes, the tracker closes, and so does a
        process group the session made."""
        self._watchdog.stop()
        self._gpu.stop()
        self._heartbeat.close()
        self._tracker.close(int(code))
        # A save or cold copy in flight finishes first; a finished run's memory tier goes.
        self._checkpointer.close(finished=code == ExitCode.DONE)
        if self._owns_comm:
            self._comm.close()
        if self._context is not None and not self._context.outcomes:
            self._context.outcomes.append(RunOutcome(
                code, self._progress.step, self._stop.signal_name if code == ExitCode.RESUME else None))

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world_size

    @property
    def device(self) -> torch.device:
        return self._comm.device

    @property
    def step(self) -> int:
        """The last step every rank ended (the resumed one, before the first)."""
        return self._progress.step

    @property
    def model(self) -> nn.Module:
        return self._state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self._state.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        return self._state.scheduler

    # --- the built-in trainer's side ---------------------------------------------------------------
    def start(self, data: dict[str, Any] | None = None) -> None:
        """The attempt's `start` event (every rank's pid and host), its record line, the watchdog."""
        comm = self._comm
        # Every rank's pid: a rank the kernel's OOM killer takes is named by pid in its log.
        ranks = comm.all_gather_object((os.getpid(), os.uname().nodename, record.process_started(),
                                        getattr(comm, "setup_s", 0.0)))
        if self.speaks:
            log.info("run directory: %s", self.run_dir, extra=LOG_ONLY)  # the launcher has said it
            self._events.emit(ledger.Start(world_size=comm.world_size, pid=os.getpid(), host=os.uname().nodename,
                                           process_started=ranks[0][2], pids=[r[0] for r in ranks],
                                           hosts=[r[1] for r in ranks], process_starts=[r[2] or "" for r in ranks],
                                           rendezvous_s=round(max(r[3] for r in ranks), 3)), 0)
            record.record_attempt(self.run_dir, comm.world_size, data=data)
        self._replay.hosts = sorted({r[1] for r in ranks})
        self.announce("start")
        if self._cfg.monitor.enabled:
            self._watchdog.start()
            self._gpu.start()

    def sync(self, step: int, compute_s: float = 0.0, wait_s: float = 0.0, stop: bool | None = None) -> StepSync:
        """The step's one all-reduce: every rank learns whether any rank must stop. `stop`: what this
        rank says instead of its own stop request (the replica groups' agreed flag)."""
        c, asked = self._comm, self._stop.requested if stop is None else stop
        values = StepSync.encode(asked, c.rank == 0 and self._checkpointer.time_due(), c.rank,
                                 c.world_size, compute_s, wait_s, self._replay.pending)
        return StepSync.decode(c.sum_floats(values), c.world_size)

    def advance(self, step: int, tokens: int, step_s: float) -> None:
        """Every rank ended `step`: the progress, the watchdog and the heartbeat move on."""
        p = self._progress
        p.step, p.tokens_seen, p.train_seconds = step, p.tokens_seen + tokens, p.train_seconds + step_s
        self._ended_any = True
        self._watchdog.beat(step, step_s)
        self._heartbeat.beat(step)

    def after_step(self, step: int, sync: StepSync, last_step: int | None = None) -> bool:
        """Hand committed steps to the tracker; then a stop request (True: saved, stop now), or a
        save a policy asks for. Nothing is saved at `last_step`: the final save follows."""
        self.commit()  # a background save may have committed since the last step
        self._replay.after(step)
        final = last_step is not None and step >= last_step
        if sync.stop and not final:
            self._stop_on_request(step)
            return True
        reason = self._checkpointer.step_reason(step) or ("time" if sync.save_time_due else None)
        if reason and not final:
            self.save(step, reason)
        if self._checkpointer.memory_due(step) and not final and self.leads:
            self._checkpointer.save_memory(step, self._snapshot("memory"))
        return False

    def commit(self) -> None:
        """Steps up to the newest committed checkpoint are final: hand them to the tracker."""
        step = self._checkpointer.committed_step
        if step > self._tracked_through:
            self._tracker.commit(step)
            self._tracked_through = step

    def finish(self, with_final: Callable[[], None] | None = None) -> None:
        """The loop ended without a stop: the final save (`checkpoint.save_final`), then `with_final`
        (the trainer's export of it), every step final, and the `finish` event last."""
        step = self._progress.step
        if self._cfg.checkpoint.save_final and self.leads:
            self.save(step, "final")
            self._checkpointer.collect(step)  # a node-local tier: all of it on rank 0's node
            if with_final is not None:
                with_final()
        self._tracker.commit(step)
        if self._comm.rank == 0 and self.leads:
            self._events.emit(ledger.Finish(tokens_seen=self._progress.tokens_seen, total_steps=self._total), step)
            log.info("finished at step %d%s; run directory: %s", step, f"/{self._total}" if self._total else "",
                     self.run_dir)

    def rollback(self, before_step: int) -> Restored | None:
        """Back to the newest checkpoint before `before_step` (a rollback past an anomaly), or to a
        fresh start without one: the state, the progress, the data position (when the checkpoint
        has one), and with them the save clock, the watchdog, the metrics and the tracker. A
        rollback's redone steps see other data: no replay compares them."""
        self._replay.state.clear()
        return self._back_before(before_step)[0]

    def replay_fallback(self, step: int) -> tuple[bool, Restored | None]:
        """The built-in trainer, when `step` (recomputed after a restart) differed from its value
        before the failure: (whether the copy that served was set aside, and what was loaded in its
        place: an older copy, or None for a fresh start). The replay goes on comparing from there."""
        if not self._replay.decide(step, in_process=True):
            return False, None
        restored, moved = self._back_before(self._replay.before_step)
        self._replay.fell_back(restored, moved)
        return True, restored

    def _back_before(self, before_step: int | None) -> tuple[Restored | None, list[dict[str, Any]]]:
        self.announce("load")
        restored = load_newest(self._checkpointer, self._state, self._comm.rank, self._events, self._refusal,
                               self._reinitialise, before_step=before_step)
        if restored is None:
            self._progress = Progress()
        else:
            self._come_back(restored.train_state)
        step = self._progress.step
        self._checkpointer.restart_clock(step)
        self._watchdog.beat(step, None)
        self._tracker.rewind(step)
        self._tracked_through = min(self._tracked_through, step)
        return restored, self._metrics.truncate_after(step) if self._metrics and self.leads else []

    def heal_snapshot(self) -> Snapshot:
        """This rank's whole state as it stands, for a replacement replica group to heal from."""
        return self._snapshot("heal")

    def announce(self, phase: str) -> None:
        """A phase that may take longer than a step tells the heartbeat monitor (`monitor.heartbeat_phase_s`)."""
        self._heartbeat.beat(self._progress.step, phase, self._cfg.monitor.heartbeat_phase_s)

    def beat(self, step: int, phase: str) -> None:
        """Progress inside a step (a micro-batch) for the heartbeat monitor."""
        self._heartbeat.beat(step, phase)

    def track(self, step: int, values: dict[str, Any]) -> None:
        """Straight to the tracker, not to metrics.jsonl: what JSON lines do not hold (tables)."""
        self._tracker.log(step, values)

    def saved(self, step: int) -> bool:
        """A save of `step` was made (or is being written)."""
        return self._checkpointer.clock.last_save_step == step

    @property
    def committed_step(self) -> int:
        """The newest step whose checkpoint is committed (durable)."""
        return self._checkpointer.committed_step

    @property
    def checkpoint_root(self) -> Path:
        """The hot tier's directory of step directories."""
        return self._checkpointer.root

    @property
    def config_hash(self) -> str:
        """The run's config hash now (checkpoints record the one they were saved under)."""
        return str(self._identity["config_hash"])

    @property
    def sections(self) -> StepSections:
        """Where a step's data, forward, backward and optimizer are timed: sent with its heartbeat."""
        return self._heartbeat.sections

    @property
    def gpu(self) -> dict[str, float]:
        """The latest reading of this rank's GPU (empty without NVML)."""
        return dict(self._gpu.latest)

    # --- inside ------------------------------------------------------------------------------------
    def _require_ended(self, step: int, where: str) -> None:
        problem = missed_end_of_step(step, self._progress.step, where)
        if problem is not None:
            raise InputError(problem)

    def _come_back(self, ts: TrainState) -> None:
        self._progress = Progress(ts.step, ts.tokens_seen, ts.train_seconds)
        self._state.restore(ts.data_state)

    def _crashed(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        bad_input = isinstance(exc, InputError)
        tb = "" if bad_input else "".join(traceback.format_exception(exc, limit=8))
        self._events.emit(ledger.Crash(error=error, traceback=tb), self._progress.step)
        if self._context is not None:
            self._context.outcomes.append(RunOutcome(exit_code_for(exc), self._progress.step, error=error))
        if bad_input:
            if self._comm.rank == 0:
                print(f"resilient_slurm: {exc}", file=sys.stderr, flush=True)
        else:
            log.error("rank %d crashed: %s", self._comm.rank, error)

    def _snapshot(self, reason: str) -> Snapshot:
        p = self._progress
        state = TrainState(step=p.step, tokens_seen=p.tokens_seen, train_seconds=p.train_seconds, reason=reason,
                           saved_at=utc_stamp(), world_size=self._comm.world_size, data_state=self._state.position(),
                           run_id=self._identity["run_id"], config_hash=self._identity["config_hash"], **self._stamp)
        return capture_snapshot(self._state.model, self._state.optimizer, self._state.scheduler, state)

    def _stop_on_request(self, step: int) -> None:
        stop = self._stop
        if stop.signum is not None:
            self._events.emit(ledger.Signal(signal=stop.signal_name or "", received=utc_stamp(stop.received_at)), step)
        self.announce("save")
        result = self._checkpointer.emergency_save(step, self._snapshot("emergency"), stop.signal_name,
                                                   stop.received_at) if self.leads else None
        self.commit()
        self._stopped = True
        if self._comm.rank == 0 and self.leads:
            why = stop.reason or stop.signal_name or "stop requested"
            self._events.emit(ledger.Stop(reason=why, checkpoint=str(result.path) if result else None,
                                          data=self._state.describe(), total_steps=self._total), step)
            log.info("stopped at step %d (%s), %s; launch again to resume", step, why,
                     "saved" if result else "not saved (no time left to)")
