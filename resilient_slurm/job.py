"""One rank's life in a run: resume → train → save → exit with a status that says what next.

The same function runs in-process (`cluster=local`, one rank), in each process of a local
multi-rank run (`python -m resilient_slurm.job RUN_DIR`), and later inside Slurm jobs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resilient_slurm import rundir
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.state import (
    Snapshot, capture_rng, model_tensors, optimizer_meta, optimizer_tensors, param_names,
)
from resilient_slurm.config import Config
from resilient_slurm.distributed import Comm, RankInfo
from resilient_slurm.events import EventLog, utc_now
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.faults import FaultInjector
from resilient_slurm.metrics import MetricsFile
from resilient_slurm.optim import build_optimizer, build_scheduler
from resilient_slurm.signals import StopRequest, install_stop_handlers
from resilient_slurm.train import StepResult, Trainer
from resilient_slurm.workload.data import GlobalBatchSampler
from resilient_slurm.workload.model import build_model, init_weights_, num_parameters

log = logging.getLogger("resilient_slurm")


@dataclass(frozen=True)
class RunOutcome:
    code: ExitCode
    step: int | None
    signal: str | None = None
    """The stop signal that ended the run (SIGUSR1, ...), if one did."""
    error: str | None = None
    """`Type: message` of the exception that ended the run, if one did."""


@dataclass
class Progress:
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0


def run(
    cfg: Config, run_dir: Path, info: RankInfo | None = None, context: dict[str, Any] | None = None,
    stop: StopRequest | None = None,
) -> RunOutcome:
    """Train rank `info` (default: from the environment) of the run in `run_dir`.

    `context` is stamped on every event this rank writes (job id, restart count, node); `stop` is
    the stop request already receiving signals, if the caller installed the handlers earlier.
    """
    stop = stop or install_stop_handlers()
    info = info or RankInfo.from_env()
    events = EventLog(run_dir / "events.jsonl", rank=info.rank, context=context)
    _setup_logging(run_dir, info.rank)
    comm: Comm | None = None
    loop: _Loop | None = None
    try:
        comm = Comm(info, cfg.cluster.backend, cfg.cluster.collective_timeout_s)
        loop = _Loop(cfg, run_dir, comm, events, stop)
        code = loop.run()
        return RunOutcome(code, loop.progress.step, stop.signal_name if code == ExitCode.RESUME else None)
    except Exception as e:  # noqa: BLE001 - recorded in the ledger, then reported by exit status
        step = loop.progress.step if loop else None
        error = f"{type(e).__name__}: {e}"
        events.emit("crash", step, error=error, traceback=traceback.format_exc(limit=8))
        log.exception("rank %d crashed", info.rank)
        return RunOutcome(ExitCode.FAILED, step, error=error)
    finally:
        if loop is not None:
            loop.checkpointer.close()  # a save or cold copy in flight finishes before the process exits
        if comm is not None:
            comm.close()


class _Loop:
    def __init__(self, cfg: Config, run_dir: Path, comm: Comm, events: EventLog, stop: StopRequest) -> None:
        self.cfg, self.run_dir, self.comm, self.events, self.stop = cfg, run_dir, comm, events, stop
        t = cfg.train
        threads = t.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or \
            max(1, (os.cpu_count() or 1) // _local_world(comm))
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(t.deterministic)
        self.model = build_model(cfg.model, t.seed).to(comm.device)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, t.max_steps)
        self.trainer = Trainer(self.model, self.optimizer, self.scheduler, comm, cfg.optim.grad_clip)
        self.sampler = GlobalBatchSampler(cfg.data, t.seed, comm.rank, comm.world_size)
        self.checkpointer = Checkpointer(run_dir, cfg.checkpoint, cfg.cluster, comm, events)
        self.metrics = MetricsFile(run_dir / "metrics.jsonl") if comm.rank == 0 else None
        self.progress = Progress()
        self.identity = rundir.read_identity(run_dir)
        self.faults = FaultInjector(cfg.fault, comm.rank)

    def run(self) -> ExitCode:
        cfg, comm = self.cfg, self.comm
        if comm.rank == 0:
            log.info("run directory: %s", self.run_dir)
            log.info("model %s: %.2fM parameters, %d rank(s), global batch %d x %d tokens",
                     cfg.model.name, num_parameters(self.model) / 1e6, comm.world_size,
                     cfg.data.global_batch_size, cfg.data.seq_len)
        if comm.rank == 0:
            self.events.emit("start", 0, world_size=comm.world_size, pid=os.getpid(), host=os.uname().nodename)
        self._resume()
        while self.progress.step < cfg.train.max_steps:
            self.faults.before_step(self.progress.step + 1)
            result = self.trainer.step(self.sampler.next_batch())
            self._advance(result)
            stop_flag, time_flag = comm.max_floats(
                [1.0 if self.stop.requested else 0.0, 1.0 if comm.rank == 0 and self.checkpointer.time_due() else 0.0]
            )
            step = self.progress.step
            if stop_flag and step < cfg.train.max_steps:
                return self._stop_on_request()
            reason = self.checkpointer.step_reason(step) or ("time" if time_flag else None)
            if reason and step < cfg.train.max_steps:
                self.checkpointer.save(step, self._snapshot(reason), reason)
        if cfg.checkpoint.save_final:
            self.checkpointer.save(self.progress.step, self._snapshot("final"), "final")
        if comm.rank == 0:
            self.events.emit("finish", self.progress.step, tokens_seen=self.progress.tokens_seen)
            log.info("finished at step %d; run directory: %s", self.progress.step, self.run_dir)
        return ExitCode.DONE

    def _resume(self) -> None:
        outcome = self.checkpointer.resume(self.model, self.optimizer, self.scheduler)
        if self.comm.rank == 0:
            for path, reason in outcome.skipped:
                self.events.emit("checkpoint_skipped", None, path=str(path), reason=reason)
        if outcome.touched_state:
            init_weights_(self.model, self.cfg.model, self.cfg.train.seed)
            self.optimizer.state.clear()
        restored = outcome.restored
        if restored is None:
            self.checkpointer.restart_clock(0)
            return
        ts = restored.train_state
        self.progress = Progress(ts["step"], ts["tokens_seen"], ts["train_seconds"])
        self.sampler.state.samples_consumed = ts["samples_consumed"]
        self.checkpointer.restart_clock(self.progress.step)
        if self.metrics:
            self.metrics.truncate_after(self.progress.step)
        if self.comm.rank == 0:
            self.events.emit("resume", self.progress.step, checkpoint=str(restored.path),
                             has_optimizer=restored.has_optimizer, source=restored.source,
                             saved_world_size=restored.saved_world_size)
            log.info("resumed from %s (step %d)", restored.path, self.progress.step)

    def _advance(self, r: StepResult) -> None:
        p = self.progress
        p.step += 1
        p.tokens_seen += r.tokens
        p.train_seconds += r.seconds
        if self.metrics:
            self.metrics.append({
                "step": p.step, "epoch": self.sampler.epoch, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm,
                "tokens": r.tokens, "tokens_per_s": r.tokens / r.seconds,
                "samples_per_s": self.cfg.data.global_batch_size / r.seconds, "step_seconds": r.seconds,
            })
        if self.comm.rank == 0 and (p.step % self.cfg.train.log_every_steps == 0 or p.step == 1):
            log.info("step %d/%d | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s",
                     p.step, self.cfg.train.max_steps, r.loss, r.lr, r.grad_norm, r.tokens / r.seconds)

    def _stop_on_request(self) -> ExitCode:
        step = self.progress.step
        if self.stop.requested:
            self.events.emit("signal", step, signal=self.stop.signal_name,
                             received=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.stop.received_at)))
        result = self.checkpointer.emergency_save(step, self._snapshot("emergency"), self.stop.signal_name,
                                                  self.stop.received_at)
        if self.comm.rank == 0:
            self.events.emit("stop", step, reason="stop requested", checkpoint=str(result.path) if result else None)
            log.info("stopped at step %d after a stop request; launch again to resume", step)
        return ExitCode.RESUME

    def _snapshot(self, reason: str) -> Snapshot:
        names = param_names(self.model)
        p = self.progress
        train_state = {
            "step": p.step, "epoch": self.sampler.epoch, "samples_consumed": self.sampler.state.samples_consumed,
            "tokens_seen": p.tokens_seen, "train_seconds": p.train_seconds, "reason": reason,
            "saved_at": utc_now(), "world_size": self.comm.world_size,
            "global_batch_size": self.cfg.data.global_batch_size, **self.identity,
        }
        return Snapshot(
            model=model_tensors(self.model),
            optimizer=optimizer_tensors(self.optimizer, names),
            rng=capture_rng(),
            json_files={
                layout.TRAIN_STATE: train_state,
                layout.SCHEDULER: self.scheduler.state_dict(),
                layout.OPTIMIZER_META: optimizer_meta(self.optimizer, names),
            },
        )


def _local_world(comm: Comm) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", comm.world_size))


def _setup_logging(run_dir: Path, rank: int) -> None:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s [rank %(rank)s] %(message)s", "%H:%M:%S")
    file_handler = logging.FileHandler(logs / f"rank-{rank}.log")
    handlers: list[logging.Handler] = [file_handler]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(lambda record: setattr(record, "rank", rank) or True)
        log.addHandler(h)


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.job RUN_DIR`: one rank of an already-prepared run."""
    if len(argv) != 1:
        print("usage: python -m resilient_slurm.job RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    run_dir = Path(argv[0])
    return int(run(rundir.load_config(run_dir), run_dir).code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
