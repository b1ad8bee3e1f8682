"""The sandbox behaves like a real multi-node cluster: multi-node steps and requeue."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def test_two_node_job_runs_one_task_on_each_node(slurm_cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo \"$SLURM_PROCID $SLURMD_NODENAME\"'\n")
    out = tmp_path / "out.txt"
    job_id = slurm_cluster.sbatch(
        script, "-N2", "--ntasks-per-node=1", f"--output={out}", f"--chdir={tmp_path}"
    )

    def finished() -> str | None:
        state = slurm_cluster.job(job_id)["JobState"]
        return state if state in FINISHED else None

    state = slurm_cluster.wait_for(f"job {job_id} to finish", finished, timeout_s=30)
    output = out.read_text()
    assert state == "COMPLETED", output
    tasks = dict(line.split() for line in output.splitlines())
    assert sorted(tasks) == ["0", "1"], output
    assert len(set(tasks.values())) == 2, f"both tasks ran on one node: {output}"


def test_requeue_runs_the_job_again_with_restart_count(slurm_cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    # One marker per run, named by the restart count (`-unset`: the first run has none); the
    # rename makes a marker appear only once its content is complete.
    script.write_text(
        "#!/bin/bash\n"
        'echo "$SLURM_JOB_ID ${SLURM_RESTART_COUNT-unset}" > marker.tmp\n'
        'mv marker.tmp "run-${SLURM_RESTART_COUNT:-0}"\n'
        "exec sleep 100\n"
    )
    job_id = slurm_cluster.sbatch(script, "-N1", "--output=/dev/null", f"--chdir={tmp_path}")
    first, second = tmp_path / "run-0", tmp_path / "run-1"
    slurm_cluster.wait_for("the first run's marker", first.exists, timeout_s=20)
    assert slurm_cluster.job(job_id)["JobState"] == "RUNNING"

    slurm_cluster.run("scontrol", "requeue", job_id)
    # Measured 6.4-7 s with cred_expire=5; the bound leaves room for a loaded machine.
    slurm_cluster.wait_for("the requeued run's marker", second.exists, timeout_s=40)

    assert first.read_text().split() == [job_id, "unset"]
    assert second.read_text().split() == [job_id, "1"]
    assert slurm_cluster.job(job_id)["Restarts"] == "1"
