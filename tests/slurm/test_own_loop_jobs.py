"""A user's own training loop (examples/own_loop, `entry=`) as a Slurm job on the sandbox cluster:
requeued mid-run, and restarted on a spare node inside its allocation after a rank is killed. Both
end bit-identical to the same loop run uninterrupted on this machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.ledger import Kind
from tests.integration.own_loops import BASE, EXAMPLE, launch_own, own_dir
from tests.integration.runs import REPO, assert_bit_identical, events, final_tensors, finish
from tests.slurm.jobs import describe, job_state, kill_driven_task, wait_for_end, wait_for_step

pytestmark = pytest.mark.slurm

STEPS = 300
TWO_NODES = ["cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.collective_timeout_s=60", "cluster.time_min=10",
             f"own.steps={STEPS}"]
_reference: list[Path] = []


def submit_own(root: Path, name: str, *overrides: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "resilient_slurm.launch", *BASE, "entry=own_loop.train:main", "cluster=slurm",
         f"run.root={root}", f"run.name={name}", *TWO_NODES, *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"submitted job (\d+)", done.stdout).group(1)


def reference(tmp_path_factory) -> Path:
    if not _reference:
        root = tmp_path_factory.mktemp("own-reference")
        code, out = finish(launch_own(root, "ref", "cluster.ranks=2", f"own.steps={STEPS}"), timeout=600)
        assert code == 0, out
        _reference.append(own_dir(root, "ref"))
    return _reference[0]


def test_the_own_loop_requeued_mid_run_resumes_bit_identical(slurm_cluster, tmp_path, tmp_path_factory):
    ref = reference(tmp_path_factory)
    job = submit_own(tmp_path, "requeued")
    rdir = own_dir(tmp_path, "requeued")
    wait_for_step(rdir, 60, 180)
    slurm_cluster.run("scontrol", "requeue", job)
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)
    ev = events(rdir)
    assert [e.restart for e in ev if e.kind is Kind.ATTEMPT] == [0, 1]
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.step == stop.step and 60 <= stop.step < STEPS
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_the_own_loop_continues_on_the_spare_after_a_rank_is_killed(idle_cluster, tmp_path, tmp_path_factory):
    ref = reference(tmp_path_factory)
    job = submit_own(tmp_path, "spare", "cluster.spare_nodes=1")
    rdir = own_dir(tmp_path, "spare")
    wait_for_step(rdir, 60, 180)
    dead = kill_driven_task(job, 1)
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)
    ev = events(rdir)
    assert job_state(job)["Restarts"] == "0" and not [e for e in ev if e.kind is Kind.REQUEUE]
    (restart,) = [e for e in ev if e.kind is Kind.RESTART_IN_ALLOCATION]
    assert restart.details.move == "spare" and restart.details.replaced == [dead]
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))
