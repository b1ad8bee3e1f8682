"""The built-in trainer: the project's model on chat data or a token mixture, the `Session`'s first user.

It adds what a session does not know: the data and its exact position (`pipeline.py`), the model and optimizer it
builds, the step (`StepRunner`) redone at a smaller micro-batch after running out of device memory,
the monitor's findings (a rollback past a NaN or a spike, a give-up), evaluation, a pause for a
search, and the finished model in `hf/`. Everything that keeps the run alive (the agreed stop,
saves, resume, ledger, metrics, tracker, watchdog) is the session's.
"""

from __future__ import annotations

import logging
import shutil
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from resilient_slurm import ledger
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.load import Restored
from resilient_slurm.checkpoint.state import reseed_rng
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config, train_steps
from resilient_slurm.data.batches import Batch
from resilient_slurm.data.tokens.errors import SourceExhausted
from resilient_slurm.evaluate.launcher import SideEvaluations
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.export.from_checkpoint import export_checkpoint
from resilient_slurm.ledger import EventLog, read_events
from resilient_slurm.model.decoder import num_parameters
from resilient_slurm.monitor.detectors import Finding, Monitor, Observation
from resilient_slurm.recovery import Action, micro_batch_after, on_findings, on_out_of_memory
from resilient_slurm.trainer import build
from resilient_slurm.data.open import open_pipeline
from resilient_slurm.session.distributed import Comm
from resilient_slurm.config.parallel import resolve
from resilient_slurm.errors import InputError
from resilient_slurm.parallel.mesh import ParallelMesh
from resilient_slurm.replica.sentinel import Sentinel
from resilient_slurm.trainer.evaluation import Evaluator
from resilient_slurm.trainer.faults import FaultInjector
from resilient_slurm.trainer.oom import StepOutOfMemory, rss_bytes
from resilient_slurm.trainer.optim import apply_hyperparameters, build_optimizer, build_scheduler
from resilient_slurm.session.resume import Registered
from resilient_slurm.session.session import Session
from resilient_slurm.session.step_sync import StepSync
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.trainer.pipeline_step import PipelineStepRunner
from resilient_slurm.trainer.replicated import ReplicaSteps, open_replicas
from resilient_slurm.trainer.step import NotCommitted, StepResult, StepRunner
from resilient_slurm.replica import heal
from resilient_slurm.replica.engine import Replicas
from resilient_slurm.tracking import Table

log = logging.getLogger("resilient_slurm")


@dataclass(frozen=True)
class Computed:
    """A step computed and applied, with its timings."""

    step: int
    result: StepResult
    start: float
    before_train: float
    wait: float
    position: int


@dataclass(frozen=True)
class StepOutcome:
    """How a step ended, when it did not simply go on: the run's exit status, or a rollback."""

    code: ExitCode | None = None
    rolled_back: bool = False


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, comm: Comm, events: EventLog, stop: StopRequest,
                 on_hang: Any) -> None:
        self.cfg, self.run_dir, self.comm, self.events, self.stop = cfg, run_dir, comm, events, stop
        t = cfg.train
        torch.use_deterministic_algorithms(t.deterministic)
        replica = comm.replica
        # With replica groups this process group is one group: its mesh has no replicated axis.
        laid_out = resolve(cfg.parallel if replica is None else replace(cfg.parallel, dp_replicate=1), comm.world_size)
        if isinstance(laid_out, str):  # an elastic shrink to a world size the fixed degrees do not divide
            raise InputError(laid_out)
        self.mesh = ParallelMesh(laid_out, comm.device.type, comm.rank)
        place = self.mesh.position
        groups, group = (1, 0) if replica is None else (replica.groups, replica.group)
        self.pipeline = open_pipeline(cfg, run_dir, comm, group * place.dp_size + place.dp_rank, groups * place.dp_size)
        self.steps = train_steps(cfg)
        """The run's length: train.max_steps, or the steps train.max_tokens takes."""
        self.stages = build.build_pipeline(cfg, comm, self.mesh) if laid_out.pp > 1 else None
        """This rank's pipeline stages (parallel.pp > 1); `model` is then one module over them."""
        self.model = self.stages.view if self.stages else build.build_model(cfg, comm, self.mesh)
        self.parameter_counts = self.stages.count_parameters() if self.stages else (
            num_parameters(self.model), sum(p.numel() for p in self.model.parameters() if p.requires_grad))
        """The whole model's parameters, and those trained."""
        self.base = build.base_model(cfg)
        """A LoRA run's base model (path, identity): recorded in its checkpoints, checked on resume."""
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.steps)
        self.replicas: Replicas | None = None if replica is None else open_replicas(
            cfg, comm, replica, (self._heal_payload, self._heal))
        tp = self.mesh.tp is not None
        self.runner = PipelineStepRunner(self.stages, self.optimizer, self.scheduler, comm, cfg.optim.grad_clip,
                                         documents=self.pipeline.documents, counts_data=place.counts_data,
                                         vocab_parallel=tp) \
            if self.stages else StepRunner(self.model, self.optimizer, self.scheduler, comm, cfg.optim.grad_clip,
                                           documents=self.pipeline.documents, counts_data=place.counts_data,
                                           vocab_parallel=tp, replicas=self.replicas)
        self.sampler = self.pipeline.sampler
        # The pipeline is the data position, registered as a user's loop registers its own.
        self.session = Session(cfg, run_dir, comm, stop, events,
                               Registered(self.model, self.optimizer, self.scheduler, self.pipeline),
                               stamp=build.lora_stamp(cfg, self.base), total_steps=self.steps,
                               refusal=lambda ts: build.resume_refusal(ts, cfg, self.base),
                               reinitialise=self._reinitialise, on_hang=on_hang)
        self.runner.sections = self.session.sections  # the step's sections go with its heartbeat
        history = read_events(self.session.paths.events)
        self.rollbacks = len(ledger.select(history, ledger.Rollback))
        # A micro-batch lowered after running out of memory holds for the rest of the run.
        self.sampler.set_micro_batch_size(micro_batch_after(history, cfg.data.micro_batch_size,
                                                            self.sampler.rows_per_rank))
        # Faults name global ranks (a replica group's process group numbers its own from 0).
        self.faults = FaultInjector(cfg.fault, replica.global_rank(comm.rank) if replica else comm.rank,
                                    hung_before=bool(ledger.select(history, ledger.Hang)),
                                    configured_micro_batch=cfg.data.micro_batch_size,
                                    cuda_error_before=any("fault.cuda_error_at_step" in c.details.error
                                                          for c in ledger.select(history, ledger.Crash)),
                                    sdc_before=bool(ledger.select(history, ledger.Sdc)))
        self.faults.attach(self.model)
        replicate = self.mesh.mesh["dp_replicate"].get_group() if "dp_replicate" in self.mesh.dims else None
        self.sentinel = Sentinel(cfg, comm, laid_out, replicate, self.model, self.optimizer, events, stop,
                                 engine=self.replicas, writes=lambda: self.writes)
        self.monitor = Monitor(cfg.monitor) if cfg.monitor.enabled else None
        self.evaluator = Evaluator(cfg, self.model, comm, self.pipeline.data, self.sampler.micro_batch_size,
                                   documents=self.pipeline.documents, place=place, stages=self.stages)
        self.benchmarks = SideEvaluations(cfg, run_dir, events, comm.rank)
        self.gave_up: str | None = None
        self.replicated = None if self.replicas is None else ReplicaSteps(
            cfg, self.replicas, self.session, events, comm.rank, place.dp_size, place.dp_rank)

    @property
    def writes(self) -> bool:
        """This rank writes the run's records: rank 0 (of the lowest live replica group)."""
        return self.comm.rank == 0 and self.session.leads

    @property
    def step(self) -> int:
        return self.session.step

    def run(self) -> ExitCode:
        cfg, comm, s = self.cfg, self.comm, self.session
        if comm.rank == 0:
            self._describe()
        s.start(data=self.pipeline.record())
        if s.speaks:
            self.events.emit(self.pipeline.ready(), 0)
        self._seed()
        if comm.replica is None or not comm.replica.heal:  # a replacement group heals from a live one instead
            restored = s.resume()
            if restored is not None:
                self._restore(restored)
            if self.replicas is not None:
                self.replicas.set_step(self.step)
        while self.step < self.steps:
            if 0 < cfg.train.pause_at_step <= self.step:
                return self._pause()
            outcome = self._step()
            if outcome.code is not None:
                return outcome.code
        s.finish(with_final=self._export)
        if self.benchmarks.due(self.step) and cfg.checkpoint.save_final:
            self._benchmark(self.step)
        return ExitCode.DONE

    def _describe(self) -> None:
        cfg, s, lay = self.cfg, self.sampler, self.mesh.layout
        g, seq = cfg.data.global_batch_size, cfg.data.seq_len
        log.info("layout: %d rank(s) = %s; global batch %d sequences x %d = %d tokens; %d micro-batch(es) of %d "
                 "per data-parallel rank per step", lay.world_size, lay.describe(), g, seq, g * seq, s.accumulation,
                 s.micro_batch_size)
        log.info("data: %s", self.pipeline.summary())
        if self.stages:
            log.info("pipeline: %s schedule, %d stage(s); this rank runs stage(s) %s", cfg.parallel.pp_schedule,
                     self.stages.num_stages, ", ".join(map(str, self.stages.indices)))
        log.info("model %s: %.2fM parameters (%.3gM trained), %d rank(s), global batch %d x %d tokens, "
                 "micro-batch %d%s", cfg.model.name, self.parameter_counts[0] / 1e6,
                 self.parameter_counts[1] / 1e6, self.comm.world_size,
                 cfg.data.global_batch_size, cfg.data.seq_len, s.micro_batch_size,
                 "" if s.micro_batch_size == cfg.data.micro_batch_size else
                 f" (data.micro_batch_size={cfg.data.micro_batch_size} ran out of memory earlier in the run)")

    def _step(self) -> StepOutcome:
        """One step, then its consequences in order: anomaly, stop request, save policy."""
        s = self.session
        try:
            done = self._compute() if self.replicated is None else self._compute_replicated()
        except SourceExhausted as e:  # data.on_exhausted=stop: the run ends, finished, at the last full step
            if self.writes:
                self.events.emit(ledger.SourceExhausted(source=e.source, sequences=e.position), self.step)
                log.info("source %s is used up (data.on_exhausted=stop): finishing at step %d", e.source, self.step)
            s.finish(with_final=self._export)
            return StepOutcome(ExitCode.DONE)
        if done is None:
            return StepOutcome(ExitCode.GAVE_UP)
        step, result, start, wait, position = done.step, done.result, done.start, done.wait, done.position
        self.faults.after_update(step, self.model)
        self.sentinel.check(step)
        step_s = time.perf_counter() - start
        self._log(step, result, step_s, wait, position)  # before the sync: it carries the replay's verdict
        synced = s.sync(step, done.before_train - start + result.compute_s, wait,
                        stop=None if self.replicated is None else result.stop)
        s.advance(step, result.tokens, step_s)
        if synced.replay_mismatch:
            return self._replay_fallback(step)
        s.commit()  # a background save may have committed since the last step
        if self.monitor:
            outcome = self._judge(self._observe(step, result, step_s, synced))
            if outcome.code is not None or outcome.rolled_back:
                return outcome
        if s.after_step(step, synced, last_step=self.steps):
            return StepOutcome(ExitCode.RESUME)
        if self.benchmarks.due(step) and step < self.steps:
            self._benchmark(step)
        return StepOutcome()

    def _compute(self) -> Computed | None:
        """The next step on this process group's ranks alone; None: it cannot be done (out of memory)."""
        step = self.step + 1
        start = time.perf_counter()
        position = self.pipeline.position
        with self.session.sections.timed("data"):
            batch = self.sampler.next_batch()
        wait = time.perf_counter() - start
        self.faults.before_step(step, self.sampler.micro_batch_size)
        poison = self.faults.poisons(step, position, self.cfg.data.global_batch_size)
        before_train = time.perf_counter()
        self.sentinel.arm(step)
        result = self._train(step, position, batch, poison)
        return None if result is None else Computed(step, result, start, before_train, wait, position)

    def _compute_replicated(self) -> Computed | None:
        """The next step over the live replica groups: a quorum (which may heal this group), this
        group's share of the batch, the step; done again under a new quorum until it commits."""
        assert self.replicated is not None
        while True:
            self.replicated.quorum()
            step = self.step + 1
            start = time.perf_counter()
            position = self.pipeline.position
            batch = self.replicated.batch(self.sampler, position)
            wait = time.perf_counter() - start
            self.faults.before_step(step, self.sampler.micro_batch_size)
            poison = self.faults.poisons(step, position, self.cfg.data.global_batch_size)
            before_train = time.perf_counter()
            self.sentinel.arm(step)
            try:
                result = self.runner.step(batch, poison=poison, stop=self.stop.requested,
                                          progress=lambda: self.session.beat(step, "micro_batch"))
            except NotCommitted as e:
                log.warning("step %d dropped: %s; doing it again", step, e)
                continue
            except StepOutOfMemory as oom:
                if not self._out_of_memory(step, oom):
                    return None
                continue
            self.pipeline.consumed(position)
            self.replicated.committed(step)
            return Computed(step, result, start, before_train, wait, position)

    def _heal_payload(self) -> dict[str, Any]:
        return heal.payload(self.session.heal_snapshot())

    def _heal(self, received: dict[str, Any]) -> None:
        """A live group's state, into this group's objects (a replacement's first quorum)."""
        installed = heal.install(received, self.model, self.optimizer, self.scheduler)
        self.session.adopt(installed.train_state)
        self._restore(installed.train_state)

    def _benchmark(self, step: int) -> None:
        """`eval.harness`: the checkpoint of `step` is evaluated by a job of its own while training
        goes on; the save is made here (every rank) when no policy made one at this step."""
        s = self.session
        if not s.saved(step):
            s.save(step, "eval")
        self.benchmarks.launch(step, s.checkpoint_root)

    def _observe(self, step: int, result: StepResult, step_s: float, synced: StepSync) -> list[Finding]:
        assert self.monitor is not None
        every = self.cfg.monitor.rss_every_steps
        return self.monitor.observe(Observation(
            step, result.loss, result.grad_norm, result.tokens / step_s, self.cfg.data.global_batch_size / step_s,
            synced.compute_s, synced.wait_s, self.session.gpu,
            rss_bytes() / 2**20 if every and step % every == 0 else None))

    def _train(self, step: int, position: int, batch: list[Batch], poison: bool) -> StepResult | None:
        """The step; redone from the same rows at a smaller micro-batch while it runs out of device
        memory and a smaller one can help. None: it cannot, and the run gives up."""
        while True:
            try:
                return self.runner.step(batch, poison=poison, progress=lambda: self.session.beat(step, "micro_batch"))
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
            self.evaluator = Evaluator(cfg, self.model, self.comm, self.pipeline.data, s.micro_batch_size,
                                       documents=self.pipeline.documents, place=self.mesh.position)
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

    def _judge(self, findings: list[Finding]) -> StepOutcome:
        """Record each finding; roll back, stop, or carry on. Only global signals (loss, gradient
        norm) may act, so every rank reaches the same decision without talking."""
        if not findings:
            return StepOutcome()
        step = self.step
        decision = on_findings((f.kind for f in findings), self.cfg.monitor.rollback_on, self.rollbacks,
                               self.cfg.monitor.max_rollbacks)
        for f in findings:
            # A rank's own measurements (GPU, memory) each rank records; the rest, the same everywhere, rank 0.
            if self.writes or f.local:
                acts = f.kind in self.cfg.monitor.rollback_on
                self.events.emit(ledger.Anomaly(kind=f.kind, message=f.message, evidence=f.evidence,
                                                action=decision.action if acts else Action.REPORT), step)
        if decision.action is Action.ROLLBACK:
            self._rollback(step, decision.reason)
            return StepOutcome(rolled_back=True)
        if decision.action is Action.GIVE_UP:
            self.gave_up = decision.reason
            if self.writes:
                self.events.emit(ledger.GaveUp(reason=decision.reason), step)
                log.error("giving up: %s", decision.reason)
            return StepOutcome(ExitCode.GAVE_UP)
        return StepOutcome()

    def _replay_fallback(self, step: int) -> StepOutcome:
        """A step recomputed after the restart differs from its value before the failure: the copy
        that served is set aside and the next one loaded, here in the process (session/replay.py);
        the replay then goes on comparing from there."""
        fell_back, restored = self.session.replay_fallback(step)
        if not fell_back:
            return StepOutcome()
        self._back_to(restored)
        return StepOutcome(rolled_back=True)

    def _back_to(self, restored: Restored | None) -> None:
        """After the session loaded a checkpoint (the data position with it, when it has one), or
        went back to a fresh start (None): the data's, and the generators' seeds."""
        if restored is None:
            self.pipeline.reset()
            self._seed()
        else:
            self._restore(restored.train_state)

    def _rollback(self, anomaly_step: int, reason: str) -> None:
        """Back to the newest checkpoint before the anomaly, past the data window that led to it."""
        cfg, comm = self.cfg, self.comm
        restored = self.session.rollback(anomaly_step)
        self._back_to(restored)
        checkpoint = str(restored.path) if restored else None
        self.rollbacks += 1
        g = cfg.data.global_batch_size
        restored_step = self.step
        skip = max(cfg.monitor.rollback_skip_batches, anomaly_step - restored_step)
        first, skipped = self.pipeline.skip(skip)
        if cfg.monitor.rollback_lr_factor != 1.0:
            # The scheduler's base LRs are saved with every checkpoint, so the lower LR persists.
            self.scheduler.base_lrs = [lr * cfg.monitor.rollback_lr_factor for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] *= cfg.monitor.rollback_lr_factor
        if self.replicas is not None:  # every group rolled back alike (the findings are the same everywhere)
            self.replicas.set_step(restored_step)
        if self.writes:
            self.events.emit(ledger.Rollback(
                reason=reason, anomaly_step=anomaly_step, checkpoint=checkpoint,
                skipped_batches=skip, skipped_positions=[first, first + skip * g],
                skipped_samples=skipped, lr_scale=cfg.monitor.rollback_lr_factor,
            ), restored_step)
            log.warning("rolled back from step %d to %d, skipping %d batches: %s", anomaly_step, restored_step,
                        skip, reason)

    def _reinitialise(self) -> None:
        """What a fresh start has, after a damaged checkpoint was partly read into the state."""
        build.fill_initial(self.model, self.cfg)
        self.optimizer.state.clear()
        self.scheduler.load_state_dict(
            build_scheduler(self.optimizer, self.cfg.optim, self.steps).state_dict())

    def _seed(self) -> None:
        """The trainer's own seeding, at a fresh start: every generator, differently on each rank,
        from train.seed (a resume then restores each rank's saved states)."""
        reseed_rng(zlib.crc32(f"{self.cfg.train.seed}:{self.comm.rank}".encode()))

    def _restore(self, ts: TrainState) -> None:
        """After the session restored the checkpoint (the data position with it): what it began, and
        the run's own hyperparameters."""
        for event in self.pipeline.take_events():
            if self.session.speaks:
                self.events.emit(event, ts.step)
        if ts.config_hash != self.session.config_hash:
            # Saved before a recorded config change (launch.prepare.AllowedChange), or by another run (a PBT
            # member's copied checkpoint): the run's own hyperparameters win over the restored ones.
            apply_hyperparameters(self.optimizer, self.scheduler, self.cfg.optim)

    def _log(self, step: int, r: StepResult, step_s: float, wait_s: float, position: int) -> None:
        data_row, crossed = self.pipeline.advanced(position, self.pipeline.position)
        if self.writes:
            for event in crossed:
                self.events.emit(event, step)
        row = {
            "epoch": self.sampler.epoch, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm,
            "tokens": r.tokens, "tokens_per_s": r.tokens / step_s,
            "samples_per_s": self.cfg.data.global_batch_size / step_s, "step_seconds": step_s,
            "data_wait_s": wait_s, **data_row, **{f"gpu_{k}": v for k, v in self.session.gpu.items()},
        }
        if self.replicated is not None:
            row["replica_missing"] = self.replicated.missing  # the report counts these steps as degraded
        if self.evaluator.due(step):
            self.session.announce("eval")
            row.update(self._evaluate(step))
        self.session.log(step, row)  # and the step line, at train.log_every_steps

    def _evaluate(self, step: int) -> dict[str, Any]:
        """Every rank evaluates its share; rank 0 gets the totals and the sample predictions."""
        result = self.evaluator.run(step)
        for metric, predictions in result.predictions.items():
            self.session.track(step, {f"eval/{metric}_predictions": Table(
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
        path = self.session.checkpoint_root / layout.step_dir_name(self.step)
        if not self.writes or not (path / layout.MANIFEST).is_file():
            return
        out = self.session.paths.hf
        self.session.announce("export")
        start = time.perf_counter()
        shutil.rmtree(out, ignore_errors=True)
        written = export_checkpoint(path, out, self.cfg, io_threads=self.cfg.checkpoint.io_threads)
        self.events.emit(ledger.Exported(path=str(out), checkpoint=str(path), dtype=written.dtype, files=written.files,
                                         seconds=round(time.perf_counter() - start, 3), format=written.format),
                         self.step)
        log.info("exported the %s to %s", "LoRA adapter" if written.format == "peft" else "model", out)

    def _pause(self) -> ExitCode:
        """`train.pause_at_step`: save (synchronously), record it and end the attempt; launching the
        run again resumes here. A search pauses trials this way (ASHA rungs, PBT generations)."""
        step, s = self.step, self.session
        s.save(step, "pause")
        if self.writes:
            self.events.emit(ledger.Paused(saved=s.committed_step == step), step)
            log.info("paused at step %d (train.pause_at_step); launch again to continue", step)
        return ExitCode.RESUME
