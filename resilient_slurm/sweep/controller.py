"""The controller: the only writer of a study. It asks Optuna for trials, launches them as runs,
reads their metrics, reports new steps, prunes, pauses and promotes, and tells Optuna the results.

Every look (`sweep.poll_s` apart): each running trial's unread metrics are reported (steps after
the last one reported, so a requeued trial counts each step once) and judged by the pruner; a
trial whose job or process has ended is classified from its ledger (finished, paused, failed).
Then the schedule (schedules.py) fills the free slots.

Killed and started again with the same command, it replays the journal and the study's ledger,
re-attaches to the Slurm jobs still running (by id, or by the run's name for a job submitted just
before the kill), reports the metrics written meanwhile, and only then launches anything: no trial
is lost or run twice. Local trials are SIGTERMed when the controller dies, save, and are resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.metrics import lost_path, read_metrics
from resilient_slurm.config import ConfigError, SweepConfig
from resilient_slurm.console import progress, say
from resilient_slurm.launch.prepare import AllowedChange
from resilient_slurm.ledger import (
    LEDGER_FILE,
    EventLog,
    SweepStarted,
    TrialFailed,
    TrialFinished,
    TrialPaused,
    TrialPruned,
    read_events,
)
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.sweep import feed
from resilient_slurm.sweep.backends import Backend, Handle
from resilient_slurm.sweep.launcher import TrialLauncher
from resilient_slurm.sweep.outcome import Ended, classify
from resilient_slurm.sweep.replay import CopyIntent, Status, replay

_RESULTS = {optuna.trial.TrialState.COMPLETE: "complete", optuna.trial.TrialState.PRUNED: "pruned",
            optuna.trial.TrialState.FAIL: "failed"}
_FINISHED = tuple(_RESULTS)


@dataclass
class TrialRun:
    """The controller's view of one trial."""

    number: int
    trial_id: int
    run_dir: Path
    params: dict[str, Any]
    status: Status
    target: int
    why: str = "new"
    handle: Handle | None = None
    reported: dict[int, float] = field(default_factory=dict)
    paused_at: int | None = None
    reached: int = 0
    """The highest step it paused or finished at."""
    cancelling: bool = False
    copy: CopyIntent | None = None
    jobs: list[str] = field(default_factory=list)
    result: str = ""
    """Once done: complete, pruned or failed."""
    computed: int = 0
    """Trial-steps computed so far (metrics rows kept and lost)."""
    step: int = 0
    _stamp: tuple[float, ...] = ()

    @property
    def run(self) -> str:
        return self.run_dir.name


class Controller:
    def __init__(self, settings: SweepConfig, max_steps: int, study: optuna.Study,
                 distributions: dict[str, optuna.distributions.BaseDistribution], study_dir: Path,
                 launcher: TrialLauncher, backend: Backend, schedule: Any, stop: StopRequest,
                 local: bool, sleep: Callable[[float], None] = time.sleep) -> None:
        self.s = settings
        self.max_steps = max_steps
        self.study = study
        self.distributions = distributions
        self.dir = study_dir
        self.launcher = launcher
        self.backend = backend
        self.schedule = schedule
        self.stop = stop
        self.local = local
        self.sleep = sleep
        self.log = EventLog(study_dir / LEDGER_FILE, rank=-1)
        self.trials: dict[int, TrialRun] = {}
        self._optuna: dict[int, optuna.trial.Trial] = {}
        self.bar = progress(0, "", enabled=False)
        """The search's progress while `run` runs."""

    # --- the loop
    def run(self, planned: int | None = None) -> bool:
        """Until the search is done (True) or a stop is requested (False). `planned`: the trials the
        search will run, for its progress (trials finished, running, the best objective so far)."""
        trials = [t for t in self.study.trials if t.state is not optuna.trial.TrialState.WAITING]
        unfinished = sum(t.state not in _FINISHED for t in trials)
        self.log.emit(SweepStarted(study=self.dir.name, resumed=bool(trials), trials=len(trials), running=unfinished),
                      None)
        self._recover()
        with progress(planned or None, f"sweep {self.dir.name}", unit="trials") as self.bar:
            while True:
                self._watch()
                self._show()
                if self.stop.requested:
                    return False
                self.schedule.fill(self)
                if self.schedule.done(self):
                    self.schedule.finish(self)
                    self._show()
                    return True
                self.sleep(self.s.poll_s)

    def _show(self) -> None:
        done = len(self.with_status(Status.DONE))
        values = [v for t in self.trials.values() if (v := feed.final_value(t.reported)) is not None]
        best = (min if self.s.direction == "minimize" else max)(values) if values else None
        self.bar.set_postfix_str(f"{len(self.in_flight())} running, {len(self.with_status(Status.PAUSED))} paused, "
                                 f"best {self.s.metric} " + (f"{best:.6g}" if best is not None else "-"), refresh=False)
        self.bar.update(done - self.bar.n)  # redraws at most every LOG_INTERVAL_S off a terminal

    # --- what the schedules use
    def in_flight(self) -> list[TrialRun]:
        return [t for t in self.trials.values() if t.status is Status.RUNNING]

    def free_slots(self) -> int:
        return self.s.parallel - len(self.in_flight())

    def with_status(self, status: Status) -> list[TrialRun]:
        return [t for t in sorted(self.trials.values(), key=lambda t: t.number) if t.status is status]

    def asked(self) -> int:
        return len(self.trials)

    def spent(self) -> int:
        return sum(t.computed for t in self.trials.values())

    def budget_allows(self, cost: int) -> bool:
        """A start that may compute `cost` more steps keeps every trial, at its target, in budget."""
        if not self.s.budget_steps:
            return True
        ahead = sum(max(t.target - t.step, 0) for t in self.trials.values()
                    if t.status in (Status.RUNNING, Status.PENDING))
        return self.spent() + ahead + cost <= self.s.budget_steps

    def ask(self, target: int) -> TrialRun:
        trial = self.study.ask(self.distributions)
        self._optuna[trial.number] = trial
        t = TrialRun(trial.number, trial._trial_id, self.dir.parent.parent / self.launcher.run_name(trial.number),
                     dict(trial.params), Status.PENDING, target)
        self.trials[t.number] = t
        return t

    def start(self, t: TrialRun, allow: AllowedChange | None = None) -> bool:
        """Launch a pending trial to its target; a config that does not validate fails the trial."""
        try:
            launch = self.launcher.launch(t.number, t.params, t.target, self.max_steps, t.why, allow)
        except ConfigError as e:
            self.fail(t, f"config error: {'; '.join(str(e).splitlines())}")
            return False
        except Exception as e:  # noqa: BLE001 - sbatch refused it, say why and go on with the others
            self.fail(t, f"could not start: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")
            return False
        t.handle, t.status, t.copy = launch.handle, Status.RUNNING, None
        if launch.handle.job:
            t.jobs.append(launch.handle.job)
        where = f"job {launch.handle.job}" if launch.handle.job else f"pid {launch.handle.pid}"
        _say(f"trial {t.number} ({t.why}): {t.run} to step {t.target}, {where}")
        return True

    def fail(self, t: TrialRun, reason: str) -> None:
        self.study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        t.status, t.result = Status.DONE, "failed"
        self.log.emit(TrialFailed(trial=t.number, run=t.run, reason=reason), t.step or None)
        _say(f"trial {t.number} failed: {reason}")

    def prune(self, t: TrialRun, step: int, reason: str) -> None:
        """Stop a trial for good: recorded in its ledger first, then its job cancelled, then told."""
        value = feed.value_at(t.reported, step)
        details = TrialPruned(trial=t.number, run=t.run, value=value, reason=reason,
                              job=t.handle.job if t.handle else None)
        EventLog(RunDir(t.run_dir).events, rank=-1).emit(details, step)
        if t.status is Status.RUNNING and t.handle is not None:
            ok, message = self.backend.cancel(t.handle)
            if not ok:
                _say(f"could not cancel trial {t.number}: {message}")
            t.cancelling = True
        else:
            t.status = Status.DONE
        t.result = "pruned"
        self.study.tell(t.number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
        self.log.emit(details, step)
        _say(f"trial {t.number} pruned at step {step}: {reason}")

    # --- watching
    def _watch(self) -> None:
        for t in self.in_flight():
            self._ingest(t)
            assert t.handle is not None
            how = self.backend.ended(t.handle)
            if how is not None:
                self._ingest(t)
                self._ended(t, how)

    def _measure(self, t: TrialRun) -> list[dict[str, Any]] | None:
        """Its metrics rows, with what it has computed; None when nothing changed since the last look."""
        metrics = RunDir(t.run_dir).metrics
        stamp = tuple(p.stat().st_mtime_ns if p.exists() else 0 for p in (metrics, lost_path(metrics)))
        if stamp == t._stamp:
            return None
        t._stamp = stamp
        kept, lost = read_metrics(metrics), read_metrics(lost_path(metrics))
        t.computed, t.step = feed.steps_computed(kept, lost), feed.last_step(kept)
        return kept

    def _ingest(self, t: TrialRun) -> None:
        """Report the steps not reported yet; ask the pruner about the newest."""
        kept = self._measure(t)
        if kept is None or t.cancelling:  # a pruned trial is finished in Optuna: nothing more to report
            return
        new = feed.unread(kept, self.s.metric, max(t.reported, default=0))
        if not new:
            return
        trial = self._trial(t)
        for step, value in new:
            trial.report(value, step)
            t.reported[step] = value
        if self.s.pruner != "none" and trial.should_prune():
            step, value = new[-1]
            self.prune(t, step, f"{self.s.pruner} pruner at step {step}: {self.s.metric}={value:.6g}")

    def _ended(self, t: TrialRun, how: str) -> None:
        if t.cancelling:
            t.status, t.cancelling = Status.DONE, False
            return
        outcome = classify(read_events(RunDir(t.run_dir).events), how)
        if outcome.ended is Ended.FINISHED:
            t.reached = self.max_steps
            value = feed.final_value(t.reported)
            if value is None:
                self.fail(t, f"finished without a {self.s.metric} value in metrics.jsonl; set sweep.metric to one "
                             f"of its columns (val_loss needs eval.every_steps)")
                return
            self.study.tell(t.number, value, skip_if_finished=True)
            t.status, t.result = Status.DONE, "complete"
            self.log.emit(TrialFinished(trial=t.number, run=t.run, value=value), outcome.step)
            _say(f"trial {t.number} finished: {self.s.metric}={value:.6g}")
        elif outcome.ended is Ended.PAUSED:
            t.status, t.paused_at = Status.PAUSED, outcome.step
            t.reached = max(t.reached, outcome.step or 0)
            value = feed.value_at(t.reported, outcome.step or 0)
            self.log.emit(TrialPaused(trial=t.number, run=t.run, value=value), outcome.step)
            _say(f"trial {t.number} paused at step {outcome.step}: {self.s.metric}={value}")
        elif outcome.ended is Ended.PRUNED:  # pruned by a controller killed before it told Optuna
            self.study.tell(t.number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
            t.status, t.result = Status.DONE, "pruned"
            self.log.emit(TrialPruned(trial=t.number, run=t.run, value=feed.value_at(t.reported, outcome.step or 0),
                                      reason=outcome.reason), outcome.step)
        elif outcome.ended is Ended.STOPPED and self.local:
            # Its controller went away (SIGTERM on the controller's death): resume it.
            t.status, t.why = Status.PENDING, "resumed after a stop"
        else:
            reason = outcome.reason if outcome.ended is not Ended.STOPPED else \
                f"{outcome.reason}: cancelled outside the search"
            self.fail(t, reason)

    # --- restart
    def _recover(self) -> None:
        events = read_events(self.dir / LEDGER_FILE)
        where = replay(events, self.schedule.next_steps(self))
        for frozen in self.study.trials:
            if frozen.state is optuna.trial.TrialState.WAITING:
                continue
            r = where.get(frozen.number)
            t = TrialRun(frozen.number, frozen._trial_id, self.dir.parent.parent / self.launcher.run_name(frozen.number),
                         dict(r.params if r and r.params else frozen.params), Status.PENDING,
                         (r.target if r and r.target else None) or self.schedule.first_target(self),
                         reported=dict(frozen.intermediate_values))
            self.trials[t.number] = t
            if r is not None:
                t.why, t.paused_at, t.copy, t.jobs = r.why, r.paused_at, r.copy, list(r.jobs)
                t.reached = max([t.reached, r.paused_at or 0])
            if frozen.state in _FINISHED:
                t.status, t.result = Status.DONE, _RESULTS[frozen.state]
                self._measure(t)
                continue
            t.status = r.status if r is not None else Status.PENDING
            if t.status in (Status.RUNNING, Status.PENDING):
                known = [Handle(job=j) for j in t.jobs[-1:]] + ([Handle(pid=r.pid)] if r and r.pid else [])
                live = self.backend.running(t.run_dir, known)
                if live:
                    t.handle, t.status = live[-1], Status.RUNNING
                    t.jobs += [h.job for h in live if h.job and h.job not in t.jobs]
                    if classify(read_events(RunDir(t.run_dir).events), "running").ended is Ended.PRUNED:
                        # Killed between recording the pruning and cancelling the job: finish the job.
                        for h in live:
                            self.backend.cancel(h)
                        t.cancelling, t.result = True, "pruned"
                        self.study.tell(t.number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
                elif t.status is Status.RUNNING:
                    t.handle = known[-1] if known else Handle()
                    self._ingest(t)
                    self._ended(t, "gone when the controller restarted")
        for t in self.in_flight():
            self._ingest(t)

    def _trial(self, t: TrialRun) -> optuna.trial.Trial:
        if t.number not in self._optuna:
            self._optuna[t.number] = optuna.trial.Trial(self.study, t.trial_id)
        return self._optuna[t.number]


def _say(line: str) -> None:
    say(f"resilient_slurm: sweep: {line}")
