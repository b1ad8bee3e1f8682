"""The resilience layer of one rank, for any training loop: the built-in trainer's and a user's own.

A `Session` holds what keeps a run alive and nothing of what it trains: the run directory and its
ledger, the stop request that signals set, the checkpointer (periodic, time-based and emergency
saves, retention, tiers, resume), `metrics.jsonl` and the tracker (committed steps only), the hang
watchdog and the GPU sampler. Its user registers the state to save (a model, an optimizer, a
scheduler, a data position) and calls it at three points: `resume()` before the first step,
`log(step, ...)` with the step's metrics, `end_of_step(step)` after it. Every rank calls them at
the same steps: the end of a step agrees the stop across ranks in one small all-reduce
(`StepSync`), so every rank saves the same step, and a stop never cuts a step in half.

`Session.from_env` builds one from what the launcher left in the environment (`api.py` is the
public face); the built-in trainer (`trainer.py`) builds its own and uses the two halves of
`end_of_step` (`sync`, `after_step`), because its monitor acts between them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import torch
from torch import nn

from resilient_slurm import ledger
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.load import CheckpointRefused, Refusal, Restored
from resilient_slurm.checkpoint.memory import MemoryTierTooSmall
from resilient_slurm.checkpoint.state import Snapshot, capture_snapshot, reseed_rng
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.console import LOG_ONLY
from resilient_slurm.errors import InputError
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import EventLog
from resilient_slurm.monitor.gpu_sampler import GpuSampler
from resilient_slurm.rundir import RunDir, record
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.rundir.meta import read_identity
from resilient_slurm.rundir.metrics import MetricsFile
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.session import rejoin
from resilient_slurm.session.heartbeat import Heartbeat
from resilient_slurm.session.replay import ReplayVerification
from resilient_slurm.session.logs import setup_logging
from resilient_slurm.process.signals import StopRequest, install_stop_handlers
from resilient_slurm.session.watchdog import Watchdog
from resilient_slurm.tracking import open_tracker

log = logging.getLogger("resilient_slurm")

RUN_DIR_ENV = "RESILIENT_SLURM_RUN_DIR"
"""Where `Session.from_env` finds the run directory when the launcher did not hand it one."""


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class RunOutcome:
    code: ExitCode
    step: int | None
    signal: str | None = None
    """The stop signal that ended the run (SIGUSR1, ...), if one did."""
    error: str | None = None
    """`Type: message` of the exception that ended the run, or why it gave up, if either did."""
    peer_lost: str | None = None
    """A peer's death ended it (a collective failed), and this rank may restart in its process."""
    lost_at: float = 0.0
    """time.monotonic() when the peer's death was noticed (the teardown counts from there)."""


@dataclass(frozen=True)
class RankContext:
    """What the launcher already has for the rank it starts a user's function in: a `Session`
    created in that function takes these instead of building its own."""

    cfg: Config
    run_dir: Path
    info: RankInfo
    stop: StopRequest
    context: dict[str, Any] = field(default_factory=dict)
    on_hang: Callable[[int, str], None] | None = None
    outcomes: list[RunOutcome] = field(default_factory=list)
    """Where the session leaves how it ended, for the launcher's recovery decision."""


_launched: list[RankContext] = []


def launched(ctx: RankContext) -> _Installed:
    """`with launched(ctx): user_function(...)`: sessions made inside take `ctx`."""
    return _Installed(ctx)


class _Installed:
    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> RankContext:
        _launched.append(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _launched.remove(self.ctx)


@dataclass
class Progress:
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0


@dataclass(frozen=True)
class StepSync:
    """What every rank agreed at the end of a step, from one all-reduce of a few floats: the stop
    flag any rank raised, rank 0's time-policy verdict, and each rank's compute and data-wait time
    (a sum of one-hot vectors is an all-gather)."""

    stop: bool
    save_time_due: bool
    compute_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    replay_mismatch: bool = False
    """Rank 0's replay found this step different from the value logged before the failure."""

    @staticmethod
    def encode(stop: bool, save_time_due: bool, rank: int, world: int, compute_s: float, wait_s: float,
               replay_mismatch: bool = False) -> list[float]:
        return [float(stop), float(save_time_due)] + _one_hot(world, rank, compute_s) + _one_hot(world, rank, wait_s) \
            + [float(replay_mismatch)]

    @staticmethod
    def decode(values: list[float], world: int) -> StepSync:
        return StepSync(values[0] > 0, values[1] > 0, tuple(values[2:2 + world]), tuple(values[2 + world:2 + 2 * world]),
                        values[2 + 2 * world] > 0)


class Session:
    """One rank's resilience. Use it as a context manager (`with Session.from_env(...) as s:`), or,
    as the built-in trainer does, through `start()` and `close(code)`."""

    def __init__(self, cfg: Config, run_dir: Path, comm: Comm, stop: StopRequest, events: EventLog, *,
                 model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, data_state: Stateful | dict | None = None,
                 train_fields: Callable[[], dict[str, Any]] | None = None, refusal: Refusal | None = None,
                 reinitialise: Callable[[], None] | None = None, on_hang: Callable[[int, str], None] | None = None, owns_comm: bool = False,
                 context: RankContext | None = None) -> None:
        self.cfg, self.run_dir, self.comm, self.stop, self.events = cfg, run_dir, comm, stop, events
        self.paths = RunDir(run_dir)
        self.model, self.optimizer, self.scheduler, self.data_state = model, optimizer, scheduler, data_state
        self.train_fields = train_fields or (lambda: {})
        """Extra train_state.json fields of the loop that owns the session (the trainer's data position)."""
        self.refusal = refusal
        self.reinitialise = reinitialise
        """Puts back what a fresh start has, after a damaged checkpoint was partly read into the state."""
        self.owns_comm = owns_comm
        self.context = context
        self.identity = read_identity(run_dir)
        self.checkpointer = Checkpointer(run_dir, cfg.checkpoint, cfg.cluster, comm, events)
        self.metrics = MetricsFile(self.paths.metrics) if comm.rank == 0 else None
        self.tracker = open_tracker(cfg, run_dir, comm.rank)
        self.watchdog = Watchdog(cfg.monitor, self.paths.logs, events, comm.rank, on_hang or (lambda s, r: None),
                                 ExitCode.FAILED)
        self.gpu = GpuSampler(comm.local_rank, cfg.monitor.gpu_sample_s)
        self.heartbeat = Heartbeat.from_env(comm.rank, rejoin.generation())
        self.replay = ReplayVerification(cfg, comm, events, self.checkpointer)
        self.progress = Progress()
        self.tracked_through = -1
        self.stopped = False
        """A stop request ended the run at a step boundary (saved): launch again to resume."""
        self.finished = False
        self._last_end = time.perf_counter()
        self._pending_tokens = 0

    # --- building one from the environment (a user's loop) -----------------------------------------
    @classmethod
    def from_env(cls, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 data_state: Stateful | dict | None = None, *, run_dir: str | Path | None = None) -> Session:
        """A session for the rank this process is, in the run the launcher prepared: the launcher's
        own context when `python -m resilient_slurm.launch entry=...` started this function,
        otherwise the run directory (`run_dir`, or $RESILIENT_SLURM_RUN_DIR) and torchrun-style
        variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A process group the
        loop already made is adopted (and left open at the end); otherwise one is made."""
        ctx = _launched[-1] if _launched else None
        if ctx is not None:
            cfg, path, info, stop, context, on_hang = ctx.cfg, ctx.run_dir, ctx.info, ctx.stop, ctx.context, ctx.on_hang
        else:
            where = run_dir or os.environ.get(RUN_DIR_ENV)
            if not where:
                raise InputError(f"no run directory: start the loop with python -m resilient_slurm.launch entry=MODULE:FN, "
                                 f"or pass run_dir= (or set {RUN_DIR_ENV}) to one the launcher prepared")
            path, info, stop, context, on_hang = Path(where), RankInfo.from_env(), install_stop_handlers(), {}, None
            cfg = load_config(path)
            setup_logging(path, info.rank)
        adopted = torch.distributed.is_initialized()
        comm = Comm.adopt() if adopted else Comm(info, cfg.cluster.backend, cfg.cluster.collective_timeout_s)
        events = EventLog(RunDir(path).events, rank=comm.rank, context=context)
        return cls(cfg, path, comm, stop, events, model=model, optimizer=optimizer, scheduler=scheduler,
                   data_state=data_state, on_hang=on_hang, owns_comm=not adopted, context=ctx)

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Done: the final save and `finish`. Stopped: exit status 75, launch again to resume. An
        exception: recorded, and on its way (exit status 2 for bad input, 1 otherwise)."""
        if exc is not None:
            code = ExitCode.CONFIG if isinstance(exc, InputError) else ExitCode.FAILED
            self.crashed(exc)
            self.close(code)
            return
        if not self.stopped:
            self.finish()
        self.close(ExitCode.RESUME if self.stopped else ExitCode.DONE)
        if self.stopped:
            raise SystemExit(int(ExitCode.RESUME))

    def start(self, data: dict[str, Any] | None = None) -> None:
        """The attempt's `start` event (every rank's pid and host), its record line, the watchdog."""
        comm = self.comm
        # Every rank's pid: a rank the kernel's OOM killer takes is named by pid in its log.
        ranks = comm.all_gather_object((os.getpid(), os.uname().nodename, record.process_started(),
                                        getattr(comm, "setup_s", 0.0)))
        if comm.rank == 0:
            log.info("run directory: %s", self.run_dir, extra=LOG_ONLY)  # the launcher has said it
            self.events.emit(ledger.Start(world_size=comm.world_size, pid=os.getpid(), host=os.uname().nodename,
                                          process_started=ranks[0][2], pids=[r[0] for r in ranks],
                                          hosts=[r[1] for r in ranks], process_starts=[r[2] or "" for r in ranks],
                                          rendezvous_s=round(max(r[3] for r in ranks), 3)), 0)
            record.record_attempt(self.run_dir, comm.world_size, data=data)
        self.replay.hosts = sorted({r[1] for r in ranks})
        self.announce("start")
        if self.cfg.monitor.enabled:
            self.watchdog.start()
            self.gpu.start()

    def close(self, code: ExitCode) -> None:
        """On every exit path: the save in flight finishes, the tracker closes, and so does a
        process group the session made."""
        self.watchdog.stop()
        self.gpu.stop()
        self.heartbeat.close()
        self.tracker.close(int(code))
        # A save or cold copy in flight finishes first; a finished run's memory tier goes.
        self.checkpointer.close(finished=code == ExitCode.DONE)
        if self.owns_comm:
            self.comm.close()
        if self.context is not None and not self.context.outcomes:
            self.context.outcomes.append(RunOutcome(
                code, self.progress.step, self.stop.signal_name if code == ExitCode.RESUME else None))

    def crashed(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        tb = "" if isinstance(exc, InputError) else "".join(traceback.format_exception(exc, limit=8))
        self.events.emit(ledger.Crash(error=error, traceback=tb), self.progress.step)
        if self.context is not None:
            code = ExitCode.CONFIG if isinstance(exc, InputError) else ExitCode.FAILED
            self.context.outcomes.append(RunOutcome(code, self.progress.step, error=error))
        if isinstance(exc, InputError):
            if self.comm.rank == 0:
                print(f"resilient_slurm: {exc}", file=sys.stderr, flush=True)
        else:
            log.error("rank %d crashed: %s", self.comm.rank, error)

    # --- resume ----------------------------------------------------------------------------------------
    def resume(self) -> TrainState | None:
        """Load the newest checkpoint that verifies into everything registered; its train state,
        or None on a fresh start. Metrics of steps after it are moved aside (they are redone)."""
        began = time.perf_counter()
        restored = self.load_newest()
        load_s = time.perf_counter() - began
        step = restored.train_state.step if restored else 0
        if restored is not None:
            self._restore(restored.train_state)
        self.checkpointer.restart_clock(step)
        self._last_end = time.perf_counter()
        moved = self.metrics.truncate_after(step) if self.metrics else []
        if restored is not None and self.comm.rank == 0:
            self.events.emit(ledger.Resume(checkpoint=str(restored.path), has_optimizer=restored.has_optimizer,
                                           source=restored.source, saved_world_size=restored.saved_world_size,
                                           seconds=round(load_s, 3)), step)
            log.info("resumed from %s (step %d)", restored.path, step)
        self.replay.arm(restored, moved, self.checkpointer.ledger)
        return restored.train_state if restored else None

    def load_newest(self, before_step: int | None = None) -> Restored | None:
        """Load the newest valid checkpoint (of a step before `before_step`); without one, the state
        is what a fresh start has: `reinitialise` puts back what a damaged checkpoint partly
        overwrote (a loop that cannot rebuild its state raises instead; the next launch skips the
        damaged checkpoint, which is moved aside)."""
        self.announce("load")
        try:
            outcome = self.checkpointer.resume(self.model, self.optimizer, self.scheduler, before_step=before_step,
                                               refusal=self.refusal)
        except (CheckpointRefused, MemoryTierTooSmall) as e:
            raise InputError(str(e)) from None
        if self.comm.rank == 0:
            for path, reason in outcome.skipped:
                self.events.emit(ledger.CheckpointSkipped(path=str(path), reason=reason), None)
        if outcome.restored is None:
            # Python and numpy seed themselves from the OS at process start: without this, a fresh
            # start draws different dropout masks on every attempt and twin runs differ.
            reseed_rng(zlib.crc32(f"{self.cfg.train.seed}:{self.comm.rank}".encode()))
            if outcome.touched_state or before_step is not None:
                if self.reinitialise is None:
                    raise RuntimeError("a damaged checkpoint was partly loaded before it was found bad, and no "
                                       "checkpoint is left to fall back on; launch again to start fresh")
                self.reinitialise()
        return outcome.restored

    def _restore(self, ts: TrainState) -> None:
        self.progress = Progress(ts.step, ts.tokens_seen, ts.train_seconds)
        if self.data_state is None or ts.data_state is None:
            return
        if isinstance(self.data_state, dict):
            self.data_state.clear()
            self.data_state.update(ts.data_state)
        else:
            self.data_state.load_state_dict(ts.data_state)

    # --- each step -------------------------------------------------------------------------------------
    def log(self, step: int, values: dict[str, Any] | None = None, **more: Any) -> None:
        """One step's metrics: a line of metrics.jsonl (rank 0) and the tracker, which sends only
        steps a durable checkpoint covers. `tokens` (this step's, over all ranks) counts towards
        `tokens_seen`."""
        row = {"step": step, **(values or {}), **more}
        # The report counts productive time from it: a loop that does not time its steps gets the
        # time since the last step ended.
        row.setdefault("step_seconds", time.perf_counter() - self._last_end)
        self._pending_tokens = int(row.get("tokens", 0) or 0)
        if self.metrics and not self.replay.check(step, row):
            return  # a recomputed step that differs: in the replay_mismatch event, never in the metrics
        if self.metrics:
            self.metrics.append(row)
        self.tracker.log(step, row)

    def end_of_step(self, step: int) -> bool:
        """After every step, on every rank: agree on a stop, save if a policy (or the stop) says
        so. True: stop now (the emergency checkpoint is written); the `with` block then exits 75."""
        now = time.perf_counter()
        step_s, self._last_end = now - self._last_end, now
        self.advance(step, self._pending_tokens, step_s)
        self._pending_tokens = 0
        sync = self.sync(step, step_s)
        if sync.replay_mismatch:
            self.replay.decide(step, in_process=False)
        return self.after_step(step, sync)

    def advance(self, step: int, tokens: int, step_s: float) -> None:
        p = self.progress
        p.step, p.tokens_seen, p.train_seconds = step, p.tokens_seen + tokens, p.train_seconds + step_s
        self.watchdog.beat(step, step_s)
        self.heartbeat.beat(step)

    def sync(self, step: int, compute_s: float = 0.0, wait_s: float = 0.0) -> StepSync:
        """The step's one all-reduce: every rank learns whether any rank must stop."""
        c = self.comm
        values = StepSync.encode(self.stop.requested, c.rank == 0 and self.checkpointer.time_due(), c.rank,
                                 c.world_size, compute_s, wait_s, self.replay.pending)
        return StepSync.decode(c.sum_floats(values), c.world_size)

    def after_step(self, step: int, sync: StepSync, last_step: int | None = None) -> bool:
        """Hand committed steps to the tracker; then a stop request (True: saved, stop now), or a
        save a policy asks for. Nothing is saved at `last_step`: the final save follows."""
        self.commit()  # a background save may have committed since the last step
        self.replay.after(step)
        final = last_step is not None and step >= last_step
        if sync.stop and not final:
            self._stop_on_request(step)
            return True
        reason = self.checkpointer.step_reason(step) or ("time" if sync.save_time_due else None)
        if reason and not final:
            self.save(step, reason)
        if self.checkpointer.memory_due(step) and not final:
            self.checkpointer.save_memory(step, self.snapshot("memory"))
        return False

    def save(self, step: int, reason: str) -> None:
        self.announce("save")
        self.checkpointer.save(step, self.snapshot(reason), reason)
        self.heartbeat.beat(step)
        self.commit()

    def announce(self, phase: str) -> None:
        """A phase that may take longer than a step tells the heartbeat monitor (`monitor.heartbeat_phase_s`)."""
        self.heartbeat.beat(self.progress.step, phase, self.cfg.monitor.heartbeat_phase_s)

    def finish(self, with_final: Callable[[], None] | None = None) -> None:
        """The loop ended without a stop: the final save (`checkpoint.save_final`), then `with_final`
        (the trainer's export of it), every step final, and the `finish` event last."""
        step = self.progress.step
        if self.cfg.checkpoint.save_final:
            self.save(step, "final")
            self.checkpointer.collect(step)  # a node-local tier: all of it on rank 0's node
            if with_final is not None:
                with_final()
        self.tracker.commit(step)
        self.finished = True
        if self.comm.rank == 0:
            self.events.emit(ledger.Finish(tokens_seen=self.progress.tokens_seen), step)
            log.info("finished at step %d; run directory: %s", step, self.run_dir)

    def rewind(self, step: int, replay: bool = False) -> list[dict[str, Any]]:
        """Back at `step` (a rollback; `replay`: a replay's fallback): the clock, the watchdog, the
        metrics and the tracker with it; the metrics rows moved aside. A rollback's redone steps see
        other data: no replay compares them."""
        self.checkpointer.restart_clock(step)
        self.watchdog.beat(step, None)
        self.tracker.rewind(step)
        self.tracked_through = min(self.tracked_through, step)
        if not replay:
            self.replay.state.clear()
        return self.metrics.truncate_after(step) if self.metrics else []

    def commit(self) -> None:
        """Steps up to the newest committed checkpoint are final: hand them to the tracker."""
        step = self.checkpointer.committed_step
        if step > self.tracked_through:
            self.tracker.commit(step)
            self.tracked_through = step

    def snapshot(self, reason: str) -> Snapshot:
        p = self.progress
        data = self.data_state if isinstance(self.data_state, dict) or self.data_state is None \
            else self.data_state.state_dict()
        state = TrainState(step=p.step, tokens_seen=p.tokens_seen, train_seconds=p.train_seconds, reason=reason,
                           saved_at=utc_stamp(), world_size=self.comm.world_size, data_state=dict(data) if data else None,
                           run_id=self.identity["run_id"], config_hash=self.identity["config_hash"], **self.train_fields())
        return capture_snapshot(self.model, self.optimizer, self.scheduler, state)

    def _stop_on_request(self, step: int) -> None:
        if self.stop.signum is not None:
            self.events.emit(ledger.Signal(signal=self.stop.signal_name or "", received=utc_stamp(self.stop.received_at)),
                             step)
        self.announce("save")
        result = self.checkpointer.emergency_save(step, self.snapshot("emergency"), self.stop.signal_name,
                                                  self.stop.received_at)
        self.commit()
        self.stopped = True
        if self.comm.rank == 0:
            why = self.stop.reason or self.stop.signal_name or "stop requested"
            self.events.emit(ledger.Stop(reason=why, checkpoint=str(result.path) if result else None,
                                         data=where_it_stands(self.train_fields())), step)
            log.info("stopped at step %d (%s), %s; launch again to resume", step, why,
                     "saved" if result else "not saved (no time left to)")

    # --- what a loop may want to know ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def device(self) -> torch.device:
        return self.comm.device

    def steps(self, max_steps: int) -> Iterator[int]:
        """The steps still to run: from the resumed step + 1 to `max_steps`."""
        return iter(range(self.progress.step + 1, max_steps + 1))


def where_it_stands(fields: dict[str, Any]) -> dict[str, Any] | None:
    """Each source's file, offset in it, epoch and tokens, from a token mixture's position (the
    trainer's train_state `data`): what a stop records of the data. None for other loops."""
    sources = (fields.get("data") or {}).get("sources")
    if not sources:
        return None
    keep = ("file", "token", "epoch", "tokens")
    return {name: {k: v for k, v in s.items() if k in keep} for name, s in sources.items()}


def _one_hot(size: int, index: int, value: float) -> list[float]:
    out = [0.0] * size
    out[index] = value
    return out
