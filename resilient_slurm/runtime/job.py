"""One rank's life in a run: resume → train → save → exit with a status that says what next.

The same function runs in-process (`cluster=local`, one rank), in each process of a local
multi-rank run (`python -m resilient_slurm.runtime.job RUN_DIR`), and later inside Slurm jobs.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resilient_slurm import ledger
from resilient_slurm.analysis import record
from resilient_slurm.analysis.metrics import MetricsFile
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.load import CheckpointRefused, Restored
from resilient_slurm.checkpoint.memory import MemoryTierTooSmall
from resilient_slurm.checkpoint.state import (
    Snapshot,
    capture_snapshot,
    reseed_rng,
)
from resilient_slurm.config import Config
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.export.from_checkpoint import export_checkpoint
from resilient_slurm.launch import rundir
from resilient_slurm.ledger import EventLog, read_events, utc_now
from resilient_slurm.monitor.detectors import Finding, Monitor, Observation
from resilient_slurm.monitor.gpu_sampler import GpuSampler
from resilient_slurm.recovery import Action, micro_batch_after, on_findings, on_out_of_memory
from resilient_slurm.runtime import build
from resilient_slurm.runtime.distributed import Comm, RankInfo
from resilient_slurm.runtime.evaluation import Evaluator
from resilient_slurm.runtime.faults import FaultInjector
from resilient_slurm.runtime.oom import StepOutOfMemory, rss_bytes
from resilient_slurm.runtime.optim import apply_hyperparameters, build_optimizer, build_scheduler
from resilient_slurm.runtime.signals import StopRequest, install_stop_handlers
from resilient_slurm.runtime.step import StepResult, Trainer
from resilient_slurm.runtime.watchdog import Watchdog
from resilient_slurm.tracking import Table, open_tracker
from resilient_slurm.workload.batches import Batch, PackedBatchSampler
from resilient_slurm.workload.model import num_parameters

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
    stop: StopRequest | None = None, on_hang: Callable[[int, str], None] | None = None,
) -> RunOutcome:
    """Train rank `info` (default: from the environment) of the run in `run_dir`.

    `context` is stamped on every event this rank writes (job id, restart count, node); `stop` is
    the stop request already receiving signals, if the caller installed the handlers earlier;
    `on_hang(step, reason)` runs when the watchdog finds the loop stuck, just before the process
    ends (a Slurm task requeues the job there).
    """
    stop = stop or install_stop_handlers()
    info = info or RankInfo.from_env()
    if cfg.train.deterministic:
        # cuBLAS is only deterministic with a fixed workspace, and torch refuses it in deterministic
        # mode without one; set before the first matmul creates the handle. No effect on the CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    events = EventLog(run_dir / "events.jsonl", rank=info.rank, context=context)
    _setup_logging(run_dir, info.rank)
    comm: Comm | None = None
    loop: _Loop | None = None
    code = ExitCode.FAILED
    try:
        comm = Comm(info, cfg.cluster.backend, cfg.cluster.collective_timeout_s)
        loop = _Loop(cfg, run_dir, comm, events, stop, on_hang or (lambda step, reason: None))
        code = loop.run()
        return RunOutcome(code, loop.progress.step, stop.signal_name if code == ExitCode.RESUME else None,
                          error=loop.gave_up)
    except build.InputError as e:
        error = f"{type(e).__name__}: {e}"
        events.emit(ledger.Crash(error=error, traceback=""), None)
        if info.rank == 0:
            print(f"resilient_slurm: {e}", file=sys.stderr, flush=True)
        return RunOutcome(ExitCode.CONFIG, None, error=error)
    except Exception as e:  # noqa: BLE001 - recorded in the ledger, then reported by exit status
        step = loop.progress.step if loop else None
        error = f"{type(e).__name__}: {e}"
        events.emit(ledger.Crash(error=error, traceback=traceback.format_exc(limit=8)), step)
        log.exception("rank %d crashed", info.rank)
        return RunOutcome(ExitCode.FAILED, step, error=error)
    finally:
        if loop is not None:
            loop.tracker.close(int(code))
            # A save or cold copy in flight finishes before the process exits; a finished run's memory tier goes.
            loop.checkpointer.close(finished=code == ExitCode.DONE)
        if comm is not None:
            comm.close()


class _Loop:
    def __init__(self, cfg: Config, run_dir: Path, comm: Comm, events: EventLog, stop: StopRequest,
                 on_hang: Callable[[int, str], None]) -> None:
        self.cfg, self.run_dir, self.comm, self.events, self.stop = cfg, run_dir, comm, events, stop
        t = cfg.train
        threads = t.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or \
            max(1, (os.cpu_count() or 1) // _local_world(comm))
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(t.deterministic)
        self.data = build.open_data(cfg, run_dir, comm)
        self.model = build.build_model(cfg, comm)
        self.base = build.base_model(cfg)
        """A LoRA run's base model (path, identity): recorded in its checkpoints, checked on resume."""
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, t.max_steps)
        self.trainer = Trainer(self.model, self.optimizer, self.scheduler, comm, cfg.optim.grad_clip)
        self.sampler = PackedBatchSampler(self.data.train, cfg.data, t.seed, comm.rank, comm.world_size)
        self.checkpointer = Checkpointer(run_dir, cfg.checkpoint, cfg.cluster, comm, events)
        self.metrics = MetricsFile(run_dir / "metrics.jsonl") if comm.rank == 0 else None
        self.progress = Progress()
        self.identity = rundir.read_identity(run_dir)
        history = read_events(run_dir / "events.jsonl")
        self.rollbacks = len(ledger.select(history, ledger.Rollback))
        # A micro-batch lowered after running out of memory holds for the rest of the run.
        self.sampler.set_micro_batch_size(micro_batch_after(history, cfg.data.micro_batch_size,
                                                            self.sampler.rows_per_rank))
        self.faults = FaultInjector(cfg.fault, comm.rank, hung_before=bool(ledger.select(history, ledger.Hang)),
                                    configured_micro_batch=cfg.data.micro_batch_size)
        self.faults.attach(self.model)
        self.monitor = Monitor(cfg.monitor) if cfg.monitor.enabled else None
        self.watchdog = Watchdog(cfg.monitor, run_dir / "logs", events, comm.rank, on_hang, ExitCode.FAILED)
        self.gpu = GpuSampler(comm.local_rank, cfg.monitor.gpu_sample_s)
        self.evaluator = Evaluator(cfg, self.model, comm, self.data, self.sampler.micro_batch_size)
        self.tracker = open_tracker(cfg, run_dir, comm.rank)
        self.tracked_through = -1
        self.gave_up: str | None = None

    def run(self) -> ExitCode:
        cfg, comm = self.cfg, self.comm
        # Every rank's pid: a rank the kernel's OOM killer takes is named by pid in its log.
        ranks = comm.all_gather_object((os.getpid(), os.uname().nodename))
        if comm.rank == 0:
            log.info("run directory: %s", self.run_dir)
            log.info("model %s: %.2fM parameters (%.3gM trained), %d rank(s), global batch %d x %d tokens, "
                     "micro-batch %d%s", cfg.model.name, num_parameters(self.model) / 1e6,
                     sum(p.numel() for p in self.model.parameters() if p.requires_grad) / 1e6, comm.world_size,
                     cfg.data.global_batch_size, cfg.data.seq_len, self.sampler.micro_batch_size,
                     "" if self.sampler.micro_batch_size == cfg.data.micro_batch_size else
                     f" (data.micro_batch_size={cfg.data.micro_batch_size} ran out of memory earlier in the run)")
            self.events.emit(ledger.Start(world_size=comm.world_size, pid=os.getpid(), host=os.uname().nodename,
                                          process_started=record.process_started(), pids=[p for p, _ in ranks],
                                          hosts=[h for _, h in ranks]), 0)
            stats = self.data.stats
            self.events.emit(ledger.DataReady(
                digest=self.data.fingerprint.digest, files=len(self.data.fingerprint.files), rows=self.data.train.num_rows,
                val_rows=self.data.val.num_rows, cache_hit=stats.cache_hit, seconds=round(stats.seconds, 3),
                counts=stats.to_dict()), 0)
            record.record_attempt(self.run_dir, comm.world_size, data=self.data.fingerprint.to_record())
        if cfg.monitor.enabled:
            self.watchdog.start()
            self.gpu.start()
        try:
            self._resume()
            while self.progress.step < cfg.train.max_steps:
                if 0 < cfg.train.pause_at_step <= self.progress.step:
                    return self._pause()
                code = self._step()
                if code is not None:
                    return code
            if cfg.checkpoint.save_final:
                self.checkpointer.save(self.progress.step, self._snapshot("final"), "final")
                self.checkpointer.collect(self.progress.step)  # a node-local tier: all of it on rank 0's node
                self._export()
        finally:
            self.watchdog.stop()
            self.gpu.stop()
        # Finished: no step can be redone any more, so all of them are final.
        self.tracker.commit(self.progress.step)
        if comm.rank == 0:
            self.events.emit(ledger.Finish(tokens_seen=self.progress.tokens_seen), self.progress.step)
            log.info("finished at step %d; run directory: %s", self.progress.step, self.run_dir)
        return ExitCode.DONE

    def _step(self) -> ExitCode | None:
        """One step, then its consequences in order: anomaly, stop request, save policy."""
        cfg, comm = self.cfg, self.comm
        step = self.progress.step + 1
        start = time.perf_counter()
        position = self.sampler.state.samples_consumed
        batch = self.sampler.next_batch()
        wait = time.perf_counter() - start
        self.faults.before_step(step, self.sampler.micro_batch_size)
        poison = self.faults.poisons(step, position, cfg.data.global_batch_size)
        before_train = time.perf_counter()
        result = self._train(step, position, batch, poison)
        if result is None:
            return ExitCode.GAVE_UP
        step_s = time.perf_counter() - start
        # One small all-reduce per step: the stop flag, rank 0's time-policy verdict, and every
        # rank's compute and data-wait times (a sum of one-hot vectors is an all-gather).
        w, r = comm.world_size, comm.rank
        synced = comm.sum_floats(
            [1.0 if self.stop.requested else 0.0, 1.0 if r == 0 and self.checkpointer.time_due() else 0.0]
            + _one_hot(w, r, before_train - start + result.compute_s) + _one_hot(w, r, wait)
        )
        self._advance(result, step_s, wait)
        self.watchdog.beat(step, step_s)
        self._commit()  # a background save may have committed since the last step
        if self.monitor:
            every = cfg.monitor.rss_every_steps
            obs = Observation(step, result.loss, result.grad_norm, result.tokens / step_s,
                              cfg.data.global_batch_size / step_s, tuple(synced[2:2 + w]), tuple(synced[2 + w:]),
                              dict(self.gpu.latest), rss_bytes() / 2**20 if every and step % every == 0 else None)
            code = self._judge(self.monitor.observe(obs))
            if code is not None or self.progress.step < step:  # stopped, or rolled back
                return code
        if synced[0] and step < cfg.train.max_steps:
            return self._stop_on_request()
        reason = self.checkpointer.step_reason(step) or ("time" if synced[1] else None)
        if reason and step < cfg.train.max_steps:
            self.checkpointer.save(step, self._snapshot(reason), reason)
            self._commit()
        if self.checkpointer.memory_due(step) and step < cfg.train.max_steps:
            self.checkpointer.save_memory(step, self._snapshot("memory"))
        return None

    def _train(self, step: int, position: int, batch: list[Batch], poison: bool) -> StepResult | None:
        """The step; redone from the same rows at a smaller micro-batch while it runs out of device
        memory and a smaller one can help. None: it cannot, and the run gives up."""
        while True:
            try:
                return self.trainer.step(batch, poison=poison)
            except StepOutOfMemory as oom:
                if not self._out_of_memory(step, oom):
                    return None
            batch = self.sampler.batch_at(position)

    def _out_of_memory(self, step: int, oom: StepOutOfMemory) -> bool:
        """Every rank agreed the step ran out of memory: lower the micro-batch (True), or give up."""
        cfg, s = self.cfg, self.sampler
        old = s.micro_batch_size
        decision = on_out_of_memory(oom.phase, old, s.rows_per_rank, cfg.model.activation_checkpointing)
        error = oom.errors[0] if oom.errors else ""
        if decision.action is Action.RETRY and decision.micro_batch is not None:
            s.set_micro_batch_size(decision.micro_batch)
            self.evaluator = Evaluator(cfg, self.model, self.comm, self.data, s.micro_batch_size)
            if self.comm.rank == 0:
                self.events.emit(ledger.OomRetry(
                    ranks=oom.ranks, error=error, old_micro_batch=old, new_micro_batch=s.micro_batch_size,
                    configured_micro_batch=cfg.data.micro_batch_size, accumulation=s.accumulation, memory=oom.memory,
                ), step)
                log.warning("step %d: %s", step, decision.reason)
            return True
        self.gave_up = decision.reason
        if self.comm.rank == 0:
            self.events.emit(ledger.OutOfMemory(phase=oom.phase, ranks=oom.ranks, error=error, micro_batch=old,
                                                memory=oom.memory, reason=decision.reason), step)
            self.events.emit(ledger.GaveUp(reason=decision.reason), step)
            log.error("giving up at step %d: %s (%s)", step, decision.reason, error)
        return False

    def _judge(self, findings: list[Finding]) -> ExitCode | None:
        """Record each finding; roll back, stop, or carry on. Only global signals (loss, gradient
        norm) may act, so every rank reaches the same decision without talking."""
        if not findings:
            return None
        step = self.progress.step
        decision = on_findings((f.kind for f in findings), self.cfg.monitor.rollback_on, self.rollbacks,
                               self.cfg.monitor.max_rollbacks)
        for f in findings:
            # A rank's own measurements (GPU, memory) each rank records; the rest, the same everywhere, rank 0.
            if self.comm.rank == 0 or f.local:
                acts = f.kind in self.cfg.monitor.rollback_on
                self.events.emit(ledger.Anomaly(kind=f.kind, message=f.message, evidence=f.evidence,
                                                action=decision.action if acts else Action.REPORT), step)
        if decision.action is Action.ROLLBACK:
            self._rollback(step, decision.reason)
        elif decision.action is Action.GIVE_UP:
            self.gave_up = decision.reason
            if self.comm.rank == 0:
                self.events.emit(ledger.GaveUp(reason=decision.reason), step)
                log.error("giving up: %s", decision.reason)
            return ExitCode.GAVE_UP
        return None

    def _rollback(self, anomaly_step: int, reason: str) -> None:
        """Back to the newest checkpoint before the anomaly, past the data window that led to it."""
        cfg, comm = self.cfg, self.comm
        restored = self._load_newest(before_step=anomaly_step)
        if restored is None:
            self.progress = Progress()
            self.sampler.state.samples_consumed = 0
        else:
            self._restore_progress(restored.train_state)
        checkpoint = str(restored.path) if restored else None
        self.rollbacks += 1
        g = cfg.data.global_batch_size
        restored_step = self.progress.step
        skip = max(cfg.monitor.rollback_skip_batches, anomaly_step - restored_step)
        first = self.sampler.state.samples_consumed
        self.sampler.state.samples_consumed = first + skip * g
        if cfg.monitor.rollback_lr_factor != 1.0:
            # The scheduler's base LRs are saved with every checkpoint, so the lower LR persists.
            self.scheduler.base_lrs = [lr * cfg.monitor.rollback_lr_factor for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] *= cfg.monitor.rollback_lr_factor
        self.checkpointer.restart_clock(restored_step)
        self.watchdog.beat(restored_step, None)
        self.tracker.rewind(restored_step)
        self.tracked_through = min(self.tracked_through, restored_step)
        if self.metrics:
            self.metrics.truncate_after(restored_step)
        if comm.rank == 0:
            self.events.emit(ledger.Rollback(
                reason=reason, anomaly_step=anomaly_step, checkpoint=checkpoint,
                skipped_batches=skip, skipped_positions=[first, first + skip * g],
                skipped_samples=self.sampler.stream.indices(first, skip * g), lr_scale=cfg.monitor.rollback_lr_factor,
            ), restored_step)
            log.warning("rolled back from step %d to %d, skipping %d batches: %s", anomaly_step, restored_step,
                        skip, reason)

    def _resume(self) -> None:
        restored = self._load_newest()
        if restored is None:
            self.checkpointer.restart_clock(0)
            return
        self._restore_progress(restored.train_state)
        self.checkpointer.restart_clock(self.progress.step)
        if self.metrics:
            self.metrics.truncate_after(self.progress.step)
        if self.comm.rank == 0:
            self.events.emit(ledger.Resume(checkpoint=str(restored.path), has_optimizer=restored.has_optimizer,
                                           source=restored.source, saved_world_size=restored.saved_world_size),
                             self.progress.step)
            log.info("resumed from %s (step %d)", restored.path, self.progress.step)

    def _load_newest(self, before_step: int | None = None) -> Restored | None:
        """Load the newest valid checkpoint (of a step before `before_step`); without one, the state
        is what a fresh start has, even if a damaged checkpoint was partly read on the way."""
        try:
            outcome = self.checkpointer.resume(self.model, self.optimizer, self.scheduler, before_step=before_step,
                                               refusal=lambda ts: build.resume_refusal(ts, self.cfg, self.base))
        except (CheckpointRefused, MemoryTierTooSmall) as e:
            raise build.InputError(str(e)) from None
        if self.comm.rank == 0:
            for path, reason in outcome.skipped:
                self.events.emit(ledger.CheckpointSkipped(path=str(path), reason=reason), None)
        if outcome.restored is None:
            # Python and numpy seed themselves from the OS at process start: without this, a fresh
            # start draws different dropout masks on every attempt and twin runs differ.
            reseed_rng(zlib.crc32(f"{self.cfg.train.seed}:{self.comm.rank}".encode()))
        if outcome.restored is None and (outcome.touched_state or before_step is not None):
            cfg = self.cfg
            build.fill_initial(self.model, cfg)
            self.optimizer.state.clear()
            self.scheduler.load_state_dict(build_scheduler(self.optimizer, cfg.optim, cfg.train.max_steps).state_dict())
        return outcome.restored

    def _restore_progress(self, ts: dict[str, Any]) -> None:
        self.progress = Progress(ts["step"], ts["tokens_seen"], ts["train_seconds"])
        self.sampler.state.samples_consumed = ts["samples_consumed"]
        if ts.get("config_hash") != self.identity["config_hash"]:
            # Saved before a recorded config change (rundir.AllowedChange), or by another run (a PBT
            # member's copied checkpoint): the run's own hyperparameters win over the restored ones.
            apply_hyperparameters(self.optimizer, self.scheduler, self.cfg.optim)

    def _advance(self, r: StepResult, step_s: float, wait_s: float) -> None:
        p = self.progress
        p.step += 1
        p.tokens_seen += r.tokens
        p.train_seconds += step_s
        row = {
            "step": p.step, "epoch": self.sampler.epoch, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm,
            "tokens": r.tokens, "tokens_per_s": r.tokens / step_s,
            "samples_per_s": self.cfg.data.global_batch_size / step_s, "step_seconds": step_s,
            "data_wait_s": wait_s, **{f"gpu_{k}": v for k, v in self.gpu.latest.items()},
        }
        if self.evaluator.due(p.step):
            row.update(self._evaluate(p.step))
        if self.metrics:
            self.metrics.append(row)
        self.tracker.log(p.step, row)
        if self.comm.rank == 0 and (p.step % self.cfg.train.log_every_steps == 0 or p.step == 1):
            log.info("step %d/%d | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s",
                     p.step, self.cfg.train.max_steps, r.loss, r.lr, r.grad_norm, r.tokens / step_s)

    def _evaluate(self, step: int) -> dict[str, Any]:
        """Every rank evaluates its share; rank 0 gets the totals and the sample predictions."""
        result = self.evaluator.run()
        for metric, predictions in result.predictions.items():
            self.tracker.log(step, {f"eval/{metric}_predictions": Table(
                ["step", "prompt", "target", "prediction", "correct"],
                [[step, q.prompt, q.target, q.prediction, q.correct] for q in predictions],
            )})
        if self.comm.rank == 0:
            log.info("eval at step %d | val loss %.4f | %s | %.1f s", step, result.val_loss,
                     " | ".join(f"{k} {v:.3f}" for k, v in result.task.items()), result.seconds)
        return {"val_loss": result.val_loss, **result.task, "eval_seconds": result.seconds}

    def _export(self) -> None:
        """Rank 0 writes the finished model to `hf/` from the final checkpoint, streaming: in Hugging
        Face layout (bf16), or a LoRA run's PEFT adapter (fp32); a finish that runs again replaces it."""
        path = self.checkpointer.root / layout.step_dir_name(self.progress.step)
        if self.comm.rank != 0 or not (path / layout.MANIFEST).is_file():
            return
        out = self.run_dir / "hf"
        start = time.perf_counter()
        shutil.rmtree(out, ignore_errors=True)
        written = export_checkpoint(path, out, self.cfg, io_threads=self.cfg.checkpoint.io_threads)
        self.events.emit(ledger.Exported(path=str(out), checkpoint=str(path), dtype=written.dtype, files=written.files,
                                         seconds=round(time.perf_counter() - start, 3), format=written.format),
                         self.progress.step)
        log.info("exported the %s to %s", "LoRA adapter" if written.format == "peft" else "model", out)

    def _commit(self) -> None:
        """Steps up to the newest committed checkpoint are final: hand them to the tracker."""
        step = self.checkpointer.committed_step
        if step > self.tracked_through:
            self.tracker.commit(step)
            self.tracked_through = step

    def _stop_on_request(self) -> ExitCode:
        step = self.progress.step
        if self.stop.signum is not None:
            self.events.emit(ledger.Signal(
                signal=self.stop.signal_name or "", received=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                           time.gmtime(self.stop.received_at))), step)
        result = self.checkpointer.emergency_save(step, self._snapshot("emergency"), self.stop.signal_name,
                                                  self.stop.received_at)
        self._commit()
        if self.comm.rank == 0:
            why = self.stop.reason or self.stop.signal_name or "stop requested"
            self.events.emit(ledger.Stop(reason=why, checkpoint=str(result.path) if result else None), step)
            log.info("stopped at step %d after a stop request; launch again to resume", step)
        return ExitCode.RESUME

    def _pause(self) -> ExitCode:
        """`train.pause_at_step`: save (synchronously), record it and end the attempt; launching the
        run again resumes here. A search pauses trials this way (ASHA rungs, PBT generations)."""
        step = self.progress.step
        self.checkpointer.save(step, self._snapshot("pause"), "pause")
        self._commit()
        if self.comm.rank == 0:
            self.events.emit(ledger.Paused(saved=self.checkpointer.committed_step == step), step)
            log.info("paused at step %d (train.pause_at_step); launch again to continue", step)
        return ExitCode.RESUME

    def _snapshot(self, reason: str) -> Snapshot:
        p = self.progress
        train_state = {
            "step": p.step, "epoch": self.sampler.epoch, "samples_consumed": self.sampler.state.samples_consumed,
            "tokens_seen": p.tokens_seen, "train_seconds": p.train_seconds, "reason": reason,
            "saved_at": utc_now(), "world_size": self.comm.world_size,
            "global_batch_size": self.cfg.data.global_batch_size, "micro_batch_size": self.sampler.micro_batch_size,
            **self.identity,
        }
        lora = build.lora_record(self.cfg)
        if lora is not None:
            train_state.update(lora=lora, base_model=self.base)
        return capture_snapshot(self.model, self.optimizer, self.scheduler, train_state)


def _one_hot(size: int, index: int, value: float) -> list[float]:
    out = [0.0] * size
    out[index] = value
    return out


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
        h.addFilter(_RankFilter(rank))
        log.addHandler(h)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.runtime.job RUN_DIR`: one rank of an already-prepared run."""
    if len(argv) != 1:
        print("usage: python -m resilient_slurm.runtime.job RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    run_dir = Path(argv[0])
    return int(run(rundir.load_config(run_dir), run_dir).code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
