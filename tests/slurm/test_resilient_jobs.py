"""Resilient training jobs on the real local Slurm cluster: time limit, requeue, preemption, a dead
rank and a crash loop. Every interrupted run must end bit-identical to an uninterrupted one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.ledger import Kind
from tests.integration.runs import (
    REPO,
    SMALL,
    assert_bit_identical,
    events,
    final_tensors,
    run_dir,
)
from tests.slurm.jobs import (
    SLURM_STEPS,
    STEPS,
    describe,
    job_state,
    kill_task,
    reference,
    submit,
    wait_for_end,
    wait_for_step,
    wait_until,
)
from tests.slurm.test_in_allocation import RESIZED_STEPS

pytestmark = pytest.mark.slurm

TWO_NODES = ["cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.collective_timeout_s=60"]


def attempts(ev):
    return [e for e in ev if e.kind is Kind.ATTEMPT]


def test_time_limit_warning_saves_requeues_and_resumes_bit_identical(slurm_cluster, tmp_path):
    steps = [RESIZED_STEPS]  # 100, the shrink test's: one reference run for both
    ref = reference(2, *steps)
    # A 2-minute limit with a 30 s warning: Slurm sends it 30-90 s in (up to 60 s early), before
    # 100 steps paced at 0.9 s end (over 90 s after the first step, whatever the machine's load).
    # The warning can come early again in the second attempt, so a third attempt is the same story
    # once more.
    # The collective timeout under the 30 s lead (the timeout hierarchy config/schema.py checks).
    nodes = [o for o in TWO_NODES if not o.startswith("cluster.collective_timeout_s=")]
    job = submit(tmp_path, "timed", *nodes, *steps, "cluster.time_min=2", "cluster.signal_lead_s=30",
                 "cluster.collective_timeout_s=20", "fault.step_sleep_s=0.9")
    rdir = run_dir(tmp_path, "timed")
    assert wait_for_end(job, rdir, 450) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    restarts = [e.restart for e in attempts(ev)]
    warned = len(restarts) - 1  # every attempt but the last ended at a warning
    assert warned >= 1 and restarts == list(range(warned + 1)), restarts
    assert job_state(job)["Restarts"] == str(warned)
    requeues = [e for e in ev if e.kind is Kind.REQUEUE]
    assert len(requeues) == warned and all("SIGUSR1" in e.details.reason and e.details.ok for e in requeues)
    assert all("SIGUSR1" in a.details.cause for a in attempts(ev)[1:])
    saves = [e.step for e in ev if e.kind is Kind.SAVE and e.details.reason == "emergency"]
    assert len(saves) == warned and saves == sorted(set(saves)) and 0 < saves[0] and saves[-1] < 100, saves
    assert [e.details.signal for e in ev if e.kind is Kind.SIGNAL] == ["SIGUSR1"] * 2 * warned  # both ranks
    assert_bit_identical(final_tensors(ref, 100), final_tensors(rdir, 100))


def test_scontrol_requeue_mid_run_resumes_bit_identical(slurm_cluster, tmp_path):
    ref = reference(2)
    job = submit(tmp_path, "requeued", *TWO_NODES, "cluster.time_min=10", "fault.step_sleep_s=0.05")
    rdir = run_dir(tmp_path, "requeued")
    wait_for_step(rdir, 35, 120)
    slurm_cluster.run("scontrol", "requeue", job)
    assert wait_for_end(job, rdir, 180) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    assert [e.restart for e in attempts(ev)] == [0, 1]
    stop = [e for e in ev if e.kind is Kind.STOP]
    assert len(stop) == 1 and [e.details.signal for e in ev if e.kind is Kind.SIGNAL][0] == "SIGTERM"
    assert not [e for e in ev if e.kind is Kind.REQUEUE]  # Slurm requeued it, the job did not
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.step == stop[0].step
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_preemption_saves_within_grace_requeues_and_resumes_bit_identical(slurm_cluster, tmp_path):
    one_full_node = ["cluster.nodes=1", "cluster.cpus_per_task=2", "train.threads=1"]
    ref = reference(1)
    # Paced so the 30 steps left after step 30 outlast the high-priority job's scheduling
    job = submit(tmp_path, "preempted", *one_full_node, "cluster.time_min=10", "fault.step_sleep_s=0.25")
    rdir = run_dir(tmp_path, "preempted")
    wait_for_step(rdir, 30, 120)
    node = job_state(job)["NodeList"]
    high = slurm_cluster.run("sbatch", "--parsable", "-p", "high", "-w", node, "-c", "2", "--time=2",
                             "--output=/dev/null", "--wrap", "sleep 15").strip()
    slurm_cluster.submitted.append(high)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    assert len(attempts(ev)) >= 2
    (emergency,) = [e for e in ev if e.kind is Kind.SAVE and e.details.reason == "emergency"]
    signal = [e for e in ev if e.kind is Kind.SIGNAL][0]
    assert signal.details.signal == "SIGUSR1"  # preempt_send_user_signal: the job's own warning signal
    assert emergency.step == signal.step
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_a_killed_rank_ends_the_attempt_and_the_job_requeues_and_finishes(slurm_cluster, tmp_path):
    """Rank 0 (the one that writes the run's records) killed in the first attempt, rank 1 in the second."""
    steps = [RESIZED_STEPS]  # 100: room for a second kill after the first resume
    ref = reference(2, *steps)
    job = submit(tmp_path, "killed", *TWO_NODES, *steps, "cluster.time_min=10", "fault.step_sleep_s=0.05",
                 "cluster.max_restarts=2")
    rdir = run_dir(tmp_path, "killed")
    wait_for_step(rdir, 35, 120)
    kill_task(job, 0)
    wait_until("the second attempt", lambda: len(attempts(events(rdir))) == 2, 120, 0.1)
    wait_for_step(rdir, 60, 120)  # the first attempt died before step 40: this is the second's
    kill_task(job, 1)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    crashes = {(e.restart, e.rank) for e in ev if e.kind is Kind.CRASH}
    assert crashes == {(0, 1), (1, 0)}, crashes  # each time the survivor, never the victim
    requeues = [e for e in ev if e.kind is Kind.REQUEUE]
    assert len(requeues) == 2 and all(r.details.reason.startswith("failed after saving progress; requeued")
                                      and r.details.ok for r in requeues)
    assert [e.restart for e in attempts(ev)] == [0, 1, 2]
    assert_bit_identical(final_tensors(ref, 100), final_tensors(rdir, 100))


def test_the_same_crash_every_attempt_stops_after_the_restart_budget(slurm_cluster, tmp_path):
    job = submit(tmp_path, "crashloop", "cluster.time_min=10", "checkpoint.every_steps=5",
                 "fault.raise_at_step=12", "cluster.max_restarts=2")
    rdir = run_dir(tmp_path, "crashloop")
    assert wait_for_end(job, rdir, 240) == "FAILED", describe(job, rdir)

    ev = events(rdir)
    (gave_up,) = [e for e in ev if e.kind is Kind.GAVE_UP]
    assert "code bug: the same failure after step 11 on every attempt" in gave_up.details.reason
    assert "InjectedFault: injected failure at step 12" in gave_up.details.reason
    restarts = [e.restart for e in attempts(ev)]
    # Out of budget after 3 failures, or sooner once the same failure was seen on two nodes.
    assert restarts == list(range(len(restarts))) and 2 <= len(restarts) <= 4
    log = (rdir / "slurm" / f"{job}_0_log.err").read_text()
    assert "giving up: " in log and "code bug" in log


def test_an_injected_hang_is_ended_requeued_and_finishes(slurm_cluster, tmp_path):
    ref = reference(2)
    job = submit(tmp_path, "hung", *TWO_NODES, "cluster.time_min=10", "fault.hang_at_step=35",
                 "monitor.hang_floor_s=5", "monitor.hang_first_step_s=120")
    rdir = run_dir(tmp_path, "hung")
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    hangs = [e for e in ev if e.kind is Kind.HANG]
    assert hangs and hangs[0].step == 34
    assert {e.rank for e in ev if e.kind in (Kind.HANG, Kind.STACKS_DUMPED)} == {0, 1}
    (requeue,) = [e for e in ev if e.kind is Kind.REQUEUE]
    assert "hang: no step completed" in requeue.details.reason and requeue.details.ok
    assert [e.restart for e in attempts(ev)] == [0, 1]
    assert attempts(ev)[1].details.cause == requeue.details.reason
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_a_two_point_sweep_submits_two_resilient_jobs(slurm_cluster, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "resilient_slurm.launch", "-m", *SMALL, "cluster=slurm", f"run.root={tmp_path}",
         "train.max_steps=40", "optim.lr=1e-4,3e-4"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = re.findall(r"submitted job (\d+) for run (\S+)", done.stdout)
    assert len(jobs) == 2 and jobs[0][1] != jobs[1][1]
    for job, path in jobs:
        assert wait_for_end(job, Path(path), 180) == "COMPLETED", describe(job, Path(path))
        assert events(Path(path))[-1].kind is Kind.FINISH
    names = sorted(Path(path).name for _, path in jobs)
    assert names[0].endswith("-lr1e-4") and names[1].endswith("-lr3e-4")


def test_the_sbatch_template_requeued_once_finishes(slurm_cluster, tmp_path):
    ref = reference(2)
    out = tmp_path / "job.out"
    job = slurm_cluster.run(
        "sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--time=10", f"--output={out}", f"--chdir={REPO}",
        str(REPO / "sbatch" / "train.sbatch"), *SMALL, f"run.root={tmp_path}", "run.name=templated",
        "train.threads=1", SLURM_STEPS, "fault.step_sleep_s=0.05", "cluster.collective_timeout_s=60",
    ).strip()
    slurm_cluster.submitted.append(job)
    rdir = run_dir(tmp_path, "templated")
    wait_for_step(rdir, 35, 120)
    slurm_cluster.run("scontrol", "requeue", job)
    assert wait_for_end(job, rdir, 180) == "COMPLETED", describe(job, rdir) + out.read_text()[-2000:]

    ev = events(rdir)
    assert [e.restart for e in attempts(ev)] == [0, 1]
    log = out.read_text()
    assert log.count(f"job {job}, restart") == 2  # --open-mode=append kept the first run's output
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_a_job_cancelled_by_its_user_saves_and_does_not_requeue(slurm_cluster, tmp_path):
    job = submit(tmp_path, "cancelled", "cluster.time_min=10", "fault.step_sleep_s=0.05")
    rdir = run_dir(tmp_path, "cancelled")
    wait_for_step(rdir, 20, 120)
    slurm_cluster.run("scancel", job)
    assert wait_for_end(job, rdir, 60) == "CANCELLED"
    wait_until("the emergency save", lambda: [e for e in events(rdir) if e.kind is Kind.STOP], 30)
    ev = events(rdir)
    assert [e.details.signal for e in ev if e.kind is Kind.SIGNAL] == ["SIGTERM"]
    assert not [e for e in ev if e.kind is Kind.REQUEUE]
    assert job_state(job).get("Restarts") == "0" and len(attempts(ev)) == 1
