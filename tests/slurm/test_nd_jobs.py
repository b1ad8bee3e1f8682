"""Tensor parallelism x HSDP on the real local cluster: 2 nodes x 2 tasks, tp 2 inside each node (a
node is one TP group) and 2 HSDP replicas across the nodes. One job loses a node (its task
SIGKILLed: the sandbox's nodes share one machine), goes on with the spare inside the allocation, is
then requeued by Slurm, and ends bit-identical (every chunk of every checkpoint file) to the same
training uninterrupted on this machine."""

from __future__ import annotations

import pytest
import torch

from resilient_slurm.ledger import Kind
from tests.integration.runs import events, run_dir
from tests.integration.test_nd_runs import chunks
from tests.slurm.jobs import describe, kill_driven_task, reference, submit, wait_for_end, wait_for_step

pytestmark = pytest.mark.slurm

# A step at tp 2 x HSDP costs ~1 s on 4 CPU ranks (DTensor), 5x one at 2 ranks: fewer steps than the
# other Slurm tests, and a checkpoint every 10 so the fault (at step 15) still comes between two, with
# 25 steps left to inject it in.
STEPS = 40
LAYOUT = ["parallel.tp=2", "parallel.dp_replicate=2", "data.micro_batch_size=1", f"train.max_steps={STEPS}"]
TP_HSDP = ["cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.collective_timeout_s=60", "cluster.time_min=10",
           "fault.step_sleep_s=0.05", "tracking.mode=disabled", "checkpoint.every_steps=10", *LAYOUT]


def assert_same_checkpoint(a, b) -> None:
    x, y = chunks(a, STEPS), chunks(b, STEPS)
    assert x.keys() == y.keys() and any("optimizer" in k for k in x)
    for k in x:
        assert torch.equal(x[k].view(-1).view(torch.uint8), y[k].view(-1).view(torch.uint8)), f"{k} differs"


def test_a_tp_x_hsdp_job_goes_on_on_the_spare_then_requeued_by_slurm_ends_as_it_would_uninterrupted(
        idle_cluster, tmp_path):
    ref = reference(4, *LAYOUT)
    job = submit(tmp_path, "spare", *TP_HSDP, "cluster.spare_nodes=1")
    rdir = run_dir(tmp_path, "spare")
    wait_for_step(rdir, 15, 180, job)
    dead = kill_driven_task(job, 2)  # the second node's first rank: its TP group, one replica's shard
    wait_for_step(rdir, 25, 180, job)  # the run on the spare resumed from step 10: past its next checkpoint
    idle_cluster.run("scontrol", "requeue", job)
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)
    got = events(rdir)
    restart, *again = [e.details for e in got if e.kind is Kind.RESTART_IN_ALLOCATION]
    assert restart.move == "spare" and restart.replaced == [dead], restart
    # A survivor blocked in a collective with another survivor that left it at the loss waited
    # while the other's torn-down process groups (held by reference cycles) kept their gloo
    # connections open, and could miss the next generation's meeting; runtime/rank.py now collects
    # them before waiting for the driver. Should a meeting still time out, every process restarts
    # on the same nodes: slower, the same training.
    assert all((r.path, r.move) == ("step", "in place") and "DistNetworkError" in r.why for r in again), again
    assert not [e for e in got if e.kind is Kind.REQUEUE]  # Slurm requeued it, the job did not
    attempts = [(e.restart, e.job_step) for e in got if e.kind is Kind.ATTEMPT]
    assert attempts[:2] == [(0, 0), (0, 1)] and attempts[-1] == (1, 0) and len(attempts) == 3 + len(again), attempts
    assert all(e.details.world_size == 4 for e in got if e.kind is Kind.START)
    # where training went on after the loss (on the spare), and after the requeue
    assert len([e for e in got if e.kind is Kind.RESUME]) == 2
    assert_same_checkpoint(ref, rdir)
