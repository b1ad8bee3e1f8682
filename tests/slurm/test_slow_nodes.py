"""Slow nodes on the real local cluster: a rank really slowed (a CPU quota on its task's process) is
found by the job's driver as a straggler, its node swapped for the spare at the next checkpoint, and
the run speeds up again and ends bit-identical to an uninterrupted one; and a node the cluster's node
record holds too many verdicts against is left out of a new job."""

from __future__ import annotations

import time

import pytest

from resilient_slurm.analysis.faults import stragglers
from resilient_slurm.files import stamp_seconds
from resilient_slurm.health import node_record
from resilient_slurm.ledger import Kind
from resilient_slurm.rundir.metrics import read_metrics
from tests.cpucg import cpu_quota
from tests.integration.runs import assert_bit_identical, events, final_tensors, run_dir
from tests.slurm.jobs import STEPS, describe, driven_task, job_state, reference, submit, wait_for_end, wait_for_step, \
    wait_until
from tests.slurm.test_in_allocation import DRIVEN, NODES, of

pytestmark = pytest.mark.slurm


def test_a_throttled_node_is_swapped_for_the_spare_and_the_run_speeds_up_again(idle_cluster, tmp_path):
    ref = reference(2)
    record = tmp_path / "nodes.jsonl"
    job = submit(tmp_path, "slow", *DRIVEN, "cluster.spare_nodes=1", "monitor.straggler.steps=5",
                 "checkpoint.every_steps=10", f"health.node_record={record}")
    rdir = run_dir(tmp_path, "slow")
    wait_for_step(rdir, 20, 120)
    _, pid, slow = wait_until("rank 1's task", lambda: driven_task(job, 1), 60)
    # A twentieth of a CPU: several times slower than its share of a machine the other tests load
    # too (at a fifth, under load, it was barely slower than its peer: found late or never)
    with cpu_quota(0.05) as quota:
        quota.add(pid)
        throttled_at = time.time()
        wait_until("the swap", lambda: of(events(rdir), Kind.RESTART_IN_ALLOCATION), 240, 0.2)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (found,) = of(ev, Kind.STRAGGLER)
    assert (found.rank, found.node, found.details.action) == (1, slow, "swap"), found
    (spare,) = set(NODES) - set(of(ev, Kind.ATTEMPT)[0].details.nodes)
    (swap,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    r = swap.details
    assert (r.move, r.replaced, r.added, r.path) == ("swap", [slow], [spare], "step"), r
    assert slow not in of(ev, Kind.ATTEMPT)[-1].details.nodes
    assert {s.details.signal for s in of(ev, Kind.SIGNAL)} == {"SIGUSR2"}  # the driver's stop, not a time limit
    assert job_state(job)["Restarts"] == "0" and not of(ev, Kind.REQUEUE)
    (mark,) = node_record.read(str(record))
    assert (mark.node, mark.kind) == (slow, node_record.STRAGGLER)
    # The report's figures: the run is faster after the swap than while the straggler held it back.
    (line,) = stragglers(ev, read_metrics(rdir / "metrics.jsonl"))
    assert line.swapped_for == (spare,) and line.after > line.before, line
    print(f"throttled -> straggler found: {stamp_seconds(found.time) - throttled_at:.1f} s; found -> first step "
          f"without it: {line.found_to_first_step_s:.1f} s; tokens/s {line.before:.0f} -> {line.after:.0f}")
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_a_new_job_leaves_out_the_nodes_its_node_record_holds_too_many_verdicts_against(idle_cluster, tmp_path):
    record = str(tmp_path / "nodes.jsonl")
    now = time.time()
    for days in (1, 2, 3):  # three straggler verdicts within the policy's 7 days
        node_record.append(record, node_record.Mark("n2", node_record.STRAGGLER, now - days * 86400, "old"))
    node_record.append(record, node_record.Mark("n3", node_record.HANG, now - 3600, "old"))  # one hang: not enough
    job = submit(tmp_path, "fresh", *DRIVEN, f"health.node_record={record}")
    rdir = run_dir(tmp_path, "fresh")
    (submitted,) = of(events(rdir), Kind.SUBMITTED)
    assert submitted.details.exclude == "n2"
    assert job_state(job)["ExcNodeList"] == "n2"
    idle_cluster.run("scancel", job)
