"""Searches whose trials are Slurm jobs on the sandbox cluster: a controller killed mid-way and
started again, a trial requeued mid-run, and a pruned trial's job cancelled."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from resilient_slurm.ledger import Stop, Submitted, SweepStarted, TrialLaunched, TrialPruned, select
from tests.integration.runs import events, last_step
from tests.integration.sweeps import load, reports_per_step, run, start, study_dir, study_events
from tests.slurm.jobs import job_state, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def jobs_of(tmp_path):
    """Cancels every trial job a test's studies submitted, whatever happened."""
    yield
    ids = [e.details.job for p in (tmp_path / "tiny_sft" / "sweeps").glob("*")
           for e in select(study_events(p), TrialLaunched) if e.details.job]
    ids += [e.job_id for d in (tmp_path / "tiny_sft").glob("*-0*") for e in select(events(d), Submitted) if e.job_id]
    if ids:
        subprocess.run(["scancel", *sorted(set(ids))], capture_output=True, timeout=30)


def test_a_killed_controller_restarted_ends_with_each_trial_run_once_and_each_step_reported_once(
        slurm_cluster, tmp_path, jobs_of):
    # Trials of 8 s; checkpoints every 30 steps, so a requeue after step 40 redoes steps 31..4x.
    args = ["cluster=slurm", "sweep=random", "sweep.trials=4", "sweep.parallel=2", "train.max_steps=80",
            "checkpoint.every_steps=30", "fault.step_sleep_s=0.1", "cluster.term_grace_s=0.01",
            "optim.lr=tag(log,interval(1e-4,3e-3))"]
    controller = start(tmp_path, *args)
    path = wait_until("the study", lambda: next((tmp_path / "tiny_sft" / "sweeps").glob("*"), None)
                      if (tmp_path / "tiny_sft" / "sweeps").exists() else None, 60)
    first = path.parent.parent / f"{path.name}-000"

    # Trial ids count from 0 in a new journal, like trial numbers.
    wait_until("trial 0's step 40 to be reported", lambda: (0, 40) in reports_per_step(path) and last_step(first) < 60,
               90, 0.05)
    (job,) = {e.details.job for e in select(study_events(path), TrialLaunched) if e.details.trial == 0}
    # No time to save (term_grace_s): it resumes from step 30 and redoes what the controller has read.
    slurm_cluster.run("scontrol", "requeue", job)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait()
    run(tmp_path, *args, timeout=240)

    study = load(path)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert len({t.params["optim.lr"] for t in study.trials}) == 4
    trial_dirs = sorted(path.parent.parent.glob(f"{path.name}-*"))
    assert [d.name[-3:] for d in trial_dirs] == ["000", "001", "002", "003"]
    for d in trial_dirs:  # one job per trial, never submitted twice
        assert len(select(events(d), Submitted)) == 1, d
    started = select(study_events(path), SweepStarted)
    assert [e.details.resumed for e in started] == [False, True] and started[1].details.running >= 1
    # The requeued trial redid steps it had reported already; none was reported twice.
    assert job_state(job)["Restarts"] == "1" and select(events(first), Stop)
    assert (first / "metrics-lost.jsonl").exists()
    counts = reports_per_step(path)
    assert set(counts.values()) == {1}
    assert sorted(s for (t, s) in counts if t == study.trials[0]._trial_id) == [10, 20, 30, 40, 50, 60, 70, 80]


def test_a_pruned_trial_s_job_is_cancelled_and_the_reason_recorded(slurm_cluster, tmp_path, jobs_of):
    # A good learning rate first, then one far too small: the median pruner stops it at its first evaluation.
    run(tmp_path, "cluster=slurm", "sweep=grid", "sweep.pruner=median", "sweep.startup_trials=1", "sweep.parallel=1",
        "train.max_steps=60", "fault.step_sleep_s=0.05", "optim.lr=choice(3e-3,1e-7)", timeout=180)
    path = study_dir(tmp_path)
    assert [t.state.name for t in load(path).trials] == ["COMPLETE", "PRUNED"]
    pruned = path.parent.parent / f"{path.name}-001"
    (in_study,) = select(study_events(path), TrialPruned)
    (in_run,) = select(events(pruned), TrialPruned)
    assert in_study.details == in_run.details and "median pruner at step 10" in in_run.details.reason
    job = in_run.details.job
    state = wait_until("the cancelled job to end", lambda: job_state(job).get("JobState") in ("CANCELLED", "COMPLETED")
                       and job_state(job)["JobState"], 60)
    assert state == "CANCELLED" and last_step(pruned) < 60
    assert select(events(pruned), Stop)  # it saved on the way out, like any cancelled run


def test_the_controller_as_a_slurm_job_requeues_itself_at_its_warning_and_finishes_the_study(
        slurm_cluster, tmp_path, jobs_of):
    out = run(tmp_path, "cluster=slurm", "sweep.controller=slurm", "sweep=random", "sweep.trials=3",
              "sweep.parallel=2", "train.max_steps=60", "fault.step_sleep_s=0.1", "optim.lr=tag(log,interval(1e-4,3e-3))")
    path = study_dir(tmp_path)
    controller = (path / "controller" / "job_id").read_text().strip()
    assert f"submitted controller job {controller}" in out
    wait_until("two trials", lambda: len(select(study_events(path), TrialLaunched)) >= 2, 60)
    slurm_cluster.run("scancel", "--signal=USR1", controller)  # what Slurm sends before the time limit
    state = wait_until("the controller job to end", lambda: job_state(controller).get("JobState") in
                       ("COMPLETED", "FAILED", "CANCELLED") and job_state(controller)["JobState"], 150)
    assert state == "COMPLETED" and job_state(controller)["Restarts"] == "1"
    assert [e.details.resumed for e in select(study_events(path), SweepStarted)] == [False, True]
    assert [t.state.name for t in load(path).trials] == ["COMPLETE"] * 3
    assert (path / "leaderboard.csv").read_text().count("complete") == 3
