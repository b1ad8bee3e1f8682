"""A spare top-up job (cluster.spare_topup): the batch script the driver submits and what it reads
from Slurm's answers. Pure; the Slurm test in tests/slurm/test_replica_groups_jobs.py runs it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from resilient_slurm.config import ClusterConfig
from resilient_slurm.slurm import placement, srun, topup
from resilient_slurm.process.launch import RankLaunch


def test_the_script_asks_for_each_node_as_the_run_does_never_one_of_its_own():
    c = ClusterConfig(kind="slurm", partition="gpu", account="proj", qos="high", constraint="h100", tasks_per_node=8,
                      gpus_per_node=8, cpus_per_task=12, mem_gb=1.5, spare_topup=2)
    text = topup.script(c, 2, "spares-for-41", ("n1", "n2"), 95, Path("/runs/x/slurm/topup-%j.out"))
    options = [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")]
    assert options == ["--job-name=spares-for-41", "--nodes=2", "--ntasks-per-node=8", "--time=95",
                       "--output=/runs/x/slurm/topup-%j.out", "--no-requeue", "--exclude=n1,n2", "--partition=gpu",
                       "--account=proj", "--qos=high", "--constraint=h100", "--cpus-per-task=12", "--gpus-per-node=8",
                       "--mem=1536M"]
    assert text.startswith("#!/bin/bash\n") and text.rstrip().endswith("sleep 2147483647")


def test_slurms_answer_says_running_with_its_nodes_waiting_or_gone():
    running = "JobId=7 JobName=spares-for-41 JobState=RUNNING Reason=None NodeList=n[3-4] BatchHost=n3"
    assert topup.answer("7", running) == topup.TopUp("7", ("n3", "n4"))
    assert topup.answer("7", "JobId=7 JobState=PENDING Reason=Resources NodeList=(null)") == topup.TopUp("7")
    assert topup.answer("7", "JobId=7 JobState=CANCELLED NodeList=n3").gone
    assert topup.answer("7", "JobId=7 JobState=TIMEOUT NodeList=n3").gone
    assert topup.answer("7", "no state here") == topup.TopUp("7")


def test_slurms_times_are_read_in_seconds():
    assert topup._seconds("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert topup._seconds("10:00") == 600 and topup._seconds("00:00:30") == 30
    assert topup._seconds("UNLIMITED") == 365 * 86400


def test_lent_nodes_are_the_last_spares_and_leave_the_allocation_together():
    alloc = placement.Allocation(in_use=("n1", "n2"), spares=("n3",), target=2, min_nodes=2)
    more = placement.lent(alloc, ["n4", "n3", "n4"])
    assert more.spares == ("n3", "n4")
    placed, nodes = placement.replace_group(placement.lent(alloc, ["n4"]), ("n2",), ["n2"])
    assert nodes == ("n3",) and placed.spares == ("n4",)
    back = placement.without(replace(more, in_use=("n1", "n4")), ["n4"])
    assert back.in_use == ("n1",) and back.spares == ("n3",)
    # Short of the target: the next start fills it from the job's own spares (or requeues).
    assert placement.after_failure(back).allocation.in_use == ("n1", "n3")


def test_a_step_in_the_lending_job_and_what_its_task_is_told():
    argv = srun.step_argv(("n4",), 1, ["python"], job_id="77")
    assert "--jobid=77" in argv and argv[-1] == "python"
    assert "--jobid=77" not in srun.step_argv(("n4",), 1, ["python"])
    told = RankLaunch(join=3, join_rank=5, host_job="41", host_restart=2, replica_group=1, replica_heal=True)
    env = dict(e.split("=", 1) for e in told.exports())
    assert RankLaunch.from_env(env) == RankLaunch(join=3, join_rank=5, host_job="41", host_restart=2, replica_group=1,
                                                  replica_heal=True)
    assert RankLaunch.from_env(dict(e.split("=", 1) for e in RankLaunch().exports())).join_rank is None


def test_a_top_up_is_wanted_at_the_threshold_with_none_on_its_way_and_none_refused():
    assert topup.wanted(0, 0, waiting=False, refused=False)
    assert not topup.wanted(1, 0, waiting=False, refused=False)  # the default: once none is left
    assert topup.wanted(2, 2, waiting=False, refused=False) and topup.wanted(1, 2, waiting=False, refused=False)
    assert not topup.wanted(3, 2, waiting=False, refused=False)
    assert not topup.wanted(0, 2, waiting=True, refused=False)  # one job at a time
    assert not topup.wanted(0, 2, waiting=False, refused=True)  # Slurm said no since the groups started
