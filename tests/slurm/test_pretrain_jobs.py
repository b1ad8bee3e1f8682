"""Pretraining (tiny_pretrain, the token mixture) as a Slurm job on the sandbox: a rank killed
mid-run is replaced on the spare inside the allocation (the survivor goes on in its process), then
the job is requeued; it ends bit-identical to the same run uninterrupted on this machine, and the
data position (each source's place) is the uninterrupted run's at every checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.ledger import Kind
from tests.integration.runs import REPO, assert_bit_identical, events, final_tensors, finish, launch
from tests.integration.test_pretrain_runs import PRETRAIN, rdir
from tests.slurm.jobs import describe, job_state, kill_driven_task, wait_for_end, wait_for_step

pytestmark = pytest.mark.slurm

# A checkpoint every 10 steps: the kill (at step 15) and the requeue (at 35) each come after one of its
# own, with 25 steps left to make each in, and both runs keep several to compare the data position at.
STEPS = 60
RUN = ["train.threads=1", f"train.max_steps={STEPS}", "checkpoint.every_steps=10"]
TWO_NODES = ["cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.collective_timeout_s=60", "cluster.time_min=10",
             "cluster.spare_nodes=1", *RUN, "fault.step_sleep_s=0.05"]


def test_pretraining_replaced_on_a_spare_then_requeued_ends_bit_identical(idle_cluster, tmp_path):
    code, out = finish(launch(tmp_path / "ref", "ref", "cluster.ranks=2", *RUN, base=PRETRAIN), timeout=900)
    assert code == 0, out
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.launch", *PRETRAIN, "cluster=slurm",
                           f"run.root={tmp_path}", "run.name=job", *TWO_NODES],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    run = rdir(tmp_path, "job")
    wait_for_step(run, 15, 240)
    dead = kill_driven_task(job, 1)
    wait_for_step(run, 35, 240)
    idle_cluster.run("scontrol", "requeue", job)
    assert wait_for_end(job, run, 400) == "COMPLETED", describe(job, run)

    ev = events(run)
    (restart,) = [e for e in ev if e.kind is Kind.RESTART_IN_ALLOCATION]
    assert restart.details.replaced == [dead] and restart.details.path == "inprocess", restart
    assert job_state(job)["Restarts"] == "1" and [e.restart for e in ev if e.kind is Kind.ATTEMPT][-1] == 1
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    assert set(stop.details.data) == {"prose", "math"}  # the current shard of each source, in the ledger
    ref = rdir(tmp_path / "ref", "ref")
    kept = sorted({p.name for p in (run / "checkpoints").glob("step_*")} & {p.name for p in (ref / "checkpoints").glob("step_*")})
    assert len(kept) >= 2, kept  # retention keeps the newest few of each
    for name in kept:
        state = f"checkpoints/{name}/train_state.json"
        assert position(run / state) == position(ref / state), name
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(run, STEPS))


def position(train_state: Path) -> dict:
    """The data position, each source's file by its name (the two runs' corpora are cached apart)."""
    data = json.loads(train_state.read_text())["data_state"]["mixture"]
    for source in data["sources"].values():
        source["file"] = Path(source["file"]).name
    return data
