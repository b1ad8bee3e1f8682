"""Node health on the real cluster: `tools/xid_scan` runs as every node's Prolog and Epilog (the
sandbox's default hooks) over a kernel log of its own per node (DIR/kmsg/<node>.log: the one thing
faked here, since a real Xid needs a real GPU), and the job checks its node while it trains."""

from __future__ import annotations

import json
import subprocess

import pytest

from resilient_slurm.ledger import Kind
from tests.integration.runs import assert_bit_identical, events, final_tensors, run_dir
from tests.slurm.jobs import (
    STEPS,
    describe,
    job_state,
    reference,
    submit,
    wait_for_end,
    wait_for_step,
)

pytestmark = pytest.mark.slurm

XID_LINES = {
    79: "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
    13: "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
    63: "NVRM: Xid (PCI:0000:3b:00): 63, pid=4242, Row Remapper: New row marked for remapping, reset gpu to activate.",
}


def health_overrides(state_dir):
    return ["cluster.time_min=10", "fault.step_sleep_s=0.05", "health.check_every_s=2",
            f"health.kernel_log={state_dir}/kmsg/%n.log", f"cluster.exclude_file={state_dir}/exclude.json"]


def append_kernel_line(state_dir, node, text):
    with open(state_dir / "kmsg" / f"{node}.log", "a") as f:
        f.write(f"[ 1234.567890] {text}\n")


def node_states(state_dir):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], capture_output=True, text=True, timeout=30).stdout
    return {n: (state, reason) for n, state, reason in (line.split("|", 2) for line in out.splitlines())}


def test_xid_79_during_a_job_drains_and_excludes_the_node_and_the_job_finishes_elsewhere(slurm_cluster, tmp_path):
    state_dir = slurm_cluster.state_dir
    ref = reference(1)
    job = submit(tmp_path, "xid79", *health_overrides(state_dir))
    rdir = run_dir(tmp_path, "xid79")
    wait_for_step(rdir, 25, 120)
    node_a = job_state(job)["NodeList"]
    append_kernel_line(state_dir, node_a, XID_LINES[79])
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (unhealthy,) = [e for e in ev if e.kind is Kind.NODE_UNHEALTHY]
    assert unhealthy.details.bad_node == node_a and unhealthy.details.xid == 79
    (requeue,) = [e for e in ev if e.kind is Kind.REQUEUE]
    assert requeue.details.exclude == [node_a] and requeue.details.exclude_ok, requeue
    attempts = [e for e in ev if e.kind is Kind.ATTEMPT]
    assert [a.restart for a in attempts] == [0, 1]
    assert attempts[0].details.nodes == [node_a] and attempts[1].details.nodes != [node_a]
    (emergency,) = [e for e in ev if e.kind is Kind.SAVE and e.details.reason == "emergency"]
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.step == emergency.step

    state, reason = node_states(state_dir)[node_a]
    assert state.startswith("drain") and "79" in reason, (state, reason)
    listed = json.loads((state_dir / "exclude.json").read_text())["nodes"]
    assert node_a in listed and listed[node_a]["xid"] == 79
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


@pytest.mark.parametrize("xid", [13, 63])
def test_an_application_or_benign_xid_keeps_the_node_in_service(slurm_cluster, tmp_path, xid):
    state_dir = slurm_cluster.state_dir
    job = submit(tmp_path, f"xid{xid}", *health_overrides(state_dir), "train.max_steps=120")
    rdir = run_dir(tmp_path, f"xid{xid}")
    wait_for_step(rdir, 30, 120)
    node_a = job_state(job)["NodeList"]
    append_kernel_line(state_dir, node_a, XID_LINES[xid])
    assert wait_for_end(job, rdir, 180) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    assert not [e for e in ev if e.kind in (Kind.NODE_UNHEALTHY, Kind.REQUEUE)]
    assert len([e for e in ev if e.kind is Kind.ATTEMPT]) == 1
    state, reason = node_states(state_dir)[node_a]
    assert not state.startswith("drain") and state != "down", (state, reason)
    assert not (state_dir / "exclude.json").exists() or node_a not in json.loads(
        (state_dir / "exclude.json").read_text())["nodes"]
