"""Replica groups on the real local cluster (cluster.replica_ft): two groups of one node each and a
spare. SIGKILL of group 1's rank is the loss of its node as the job sees it: group 0's process never
stops (the same pid before the kill, after the replacement joined, and in the one `start` of the
job) and drops the step it was in; the driver wakes the process that stood by on the spare into
group 1, which heals from group 0 over the network (no checkpoint read: no `resume` anywhere) and
joins at a step boundary, while group 0 trains on alone or, when the warm replacement makes its
next quorum, with it. No step is lost (metrics-lost.jsonl stays empty) and the losses match an
uninterrupted twin, plain HSDP over two ranks, within 1e-4 relative. A rank really slowed (a CPU
quota on its process) is found as a straggler, and its group moves to the spare the same way while
the other trains on; the run speeds up again. A group whose rank was SIGSTOPped is found hung by the
heartbeats within 10 s, its culprit and node named, and starts anew in place (a hang alone does not
condemn a node) while the other trains on; one whose node a flipped bit was pinned on is healed in
place from the other group first, its node drained, and then moves to the spare the same way. Only the flip is faked
(`fault.sdc_step`: a real one needs faulty memory). Without a spare of its own (cluster.spare_topup), a
lost group waits out while the other trains on, and joins on a node Slurm gives a job the driver asked
for."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.analysis.faults import stragglers
from resilient_slurm.files import stamp_seconds
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import Kind
from resilient_slurm.rundir.metrics import read_metrics
from tests.cpucg import cpu_quota
from resilient_slurm.process.launch import RankLaunch
from tests.integration.runs import events, run_dir
from tests.slurm.jobs import describe, driven_tasks, job_state, reference, submit, wait_for_end, wait_for_step, wait_until
from tests.slurm.test_node_health import node_states

GROUP = RankLaunch.variable("replica_group")
"""The variable that names a rank's replica group (how a test finds a group's processes)."""

pytestmark = pytest.mark.slurm

# More than jobs.STEPS: after the kill at step 40 the survivor trains on while the driver wakes the
# standby and it heals and joins, which it must do before the run ends.
STEPS = 120
TWIN = ("parallel.dp_replicate=2", f"train.max_steps={STEPS}")
"""Plain HSDP over two ranks: the uninterrupted twin's overrides (its reference run shared with the SDC test)."""
GROUPS = [*TWIN, "cluster.replica_ft=true", "cluster.replica_timeout_s=20"]
DRIVEN = ["cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.spare_nodes=1", "cluster.collective_timeout_s=60",
          "cluster.time_min=10", "fault.step_sleep_s=0.05", "tracking.mode=disabled"]
NODES = ("n1", "n2", "n3")


def group_task(job_id: str, group: int) -> tuple[int, str] | None:
    """(pid, node) of the task a job's driver started for replica group `group` (by its environment:
    a woken standby's is not there, so this finds first starts only)."""
    for pid, env in driven_tasks(job_id):
        if env.get(GROUP.encode()) == str(group).encode():
            return pid, env[b"SLURMD_NODENAME"].decode()
    return None


def losses(rdir: Path, name: str = "metrics.jsonl") -> dict[int, float]:
    path = rdir / name
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def test_a_killed_group_is_replaced_on_the_spare_while_the_other_trains_on(idle_cluster, tmp_path):
    twin = losses(reference(2, *TWIN))
    # Top-ups asked for while one spare is left (cluster.spare_topup_at=1): at once, as the job
    # holds one. The run's spare is excluded with its own nodes, so this 3-node cluster has none to
    # give, and sbatch says so.
    job = submit(tmp_path, "groups", *DRIVEN, *GROUPS, "cluster.spare_topup=1", "cluster.spare_topup_at=1")
    rdir = run_dir(tmp_path, "groups")
    wait_for_step(rdir, 40, 180)
    survivor, _ = wait_until("group 0's task", lambda: group_task(job, 0), 30)
    victim, dead = wait_until("group 1's task", lambda: group_task(job, 1), 30)
    os.kill(victim, signal.SIGKILL)
    wait_until("the replacement to join", lambda: [e for e in events(rdir) if e.kind is Kind.REPLICA_JOIN], 180)
    assert os.path.exists(f"/proc/{survivor}"), "group 0's process never stopped"
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    kinds = [e.kind for e in ev]
    assert job_state(job)["Restarts"] == "0" and Kind.REQUEUE not in kinds
    (start,) = [e for e in ev if e.kind is Kind.START]
    assert start.details.pids == [survivor]  # the one start: group 0's process, the same to the end
    assert Kind.RESUME not in kinds and Kind.REPLICA_REFUSED not in kinds
    (top,) = [e.details for e in ev if e.kind is Kind.SPARE_TOPUP]
    assert top.state == "refused" and "Requested node configuration is not available" in top.reason, top
    leaves = [(e.details.group, e.details.live) for e in ev if e.kind is Kind.REPLICA_LEAVE]
    (heal,) = [e for e in ev if e.kind is Kind.REPLICA_HEAL]
    (join,) = [e for e in ev if e.kind is Kind.REPLICA_JOIN]
    (spare,) = set(NODES) - {start.node, dead}
    # The standby is warm: its heal may make the survivor's very next quorum (group 0 redoes the
    # step it was in with both groups), before the lighthouse drops the dead group from one
    # (a leave, then steps short of it). Either way group 0 never stopped and lost no step.
    assert leaves in ([], [(1, [0])]), leaves
    short = [r["step"] for r in map(json.loads, (rdir / "metrics.jsonl").read_text().splitlines())
             if r["replica_missing"]]
    assert bool(short) == bool(leaves) and all(s <= join.step for s in short), short
    assert (heal.details.group, heal.details.source, heal.node) == (1, 0, spare) and heal.details.bytes > 0
    assert (join.details.group, join.details.live, join.node) == (1, [0, 1], spare)
    got = losses(rdir)
    assert list(got) == list(range(1, STEPS + 1)) and not losses(rdir, "metrics-lost.jsonl")
    for step, loss in got.items():
        assert abs(loss - twin[step]) <= 1e-4 * abs(twin[step]), (step, loss, twin[step])


def test_a_throttled_groups_node_is_found_and_the_group_moves_to_the_spare_while_the_other_trains_on(
        idle_cluster, tmp_path):
    reference(2, *TWIN)
    job = submit(tmp_path, "slow", *DRIVEN, *GROUPS, "monitor.straggler.steps=5")
    rdir = run_dir(tmp_path, "slow")
    wait_for_step(rdir, 20, 180)
    survivor, _ = wait_until("group 0's task", lambda: group_task(job, 0), 30)
    pid, slow = wait_until("group 1's task", lambda: group_task(job, 1), 30)
    with cpu_quota(0.05) as quota:  # a twentieth of a CPU, as in test_slow_nodes
        quota.add(pid)
        wait_until("the replacement to join", lambda: [e for e in events(rdir) if e.kind is Kind.REPLICA_JOIN], 240)
    assert os.path.exists(f"/proc/{survivor}"), "group 0's process never stopped"
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (found,) = [e for e in ev if e.kind is Kind.STRAGGLER]
    d = found.details
    assert (found.rank, found.node, d.action, d.group) == (1, slow, "swap", 1), found
    (join,) = [e for e in ev if e.kind is Kind.REPLICA_JOIN]
    (line,) = stragglers(ev, read_metrics(rdir / "metrics.jsonl"))
    assert line.swapped_for == (join.node,) and line.after > line.before, line
    print(f"straggler found -> its group joined on the spare: {line.found_to_first_step_s:.1f} s; tokens/s "
          f"{line.before:.0f} -> {line.after:.0f}")
    assert_group_1_rejoined(job, rdir, survivor, slow)


def assert_group_1_rejoined(job: str, rdir: Path, survivor: int, node: str, in_place: bool = False) -> None:
    """Group 1, started anew on the spare instead of `node` (or on `node` again: `in_place`), joined
    while group 0's process trained on to the end; no step lost, the losses the twin's."""
    ev = events(rdir)
    kinds = [e.kind for e in ev]
    assert job_state(job)["Restarts"] == "0" and Kind.REQUEUE not in kinds and Kind.RESUME not in kinds
    (start,) = [e for e in ev if e.kind is Kind.START]
    assert start.details.pids == [survivor]
    (spare,) = set(NODES) - {start.node, node}
    (join,) = [e for e in ev if e.kind is Kind.REPLICA_JOIN]
    assert (join.details.group, join.details.live, join.node) == (1, [0, 1], node if in_place else spare)
    twin = losses(reference(2, *TWIN))
    got = losses(rdir)
    assert list(got) == list(range(1, STEPS + 1)) and not losses(rdir, "metrics-lost.jsonl")
    for step, loss in got.items():
        assert abs(loss - twin[step]) <= 1e-4 * abs(twin[step]), (step, loss, twin[step])


def test_a_stopped_rank_is_named_within_10_s_and_its_group_starts_anew_while_the_other_trains_on(
        idle_cluster, tmp_path):
    reference(2, *TWIN)
    # Group 1 starts anew in place, a process started cold (no standby there), so group 0's steps
    # are paced to outlast that start and the heal: 0.3 s each, 105 left after the stop, where at
    # 0.05 s the run could end first on a loaded machine. Not by holding group 0's CPU instead:
    # a rank starved while its peer's hang is handled goes silent itself.
    own = [a for a in DRIVEN if not a.startswith("fault.step_sleep_s")]
    job = submit(tmp_path, "hung", *own, *GROUPS, "fault.step_sleep_s=0.3")
    rdir = run_dir(tmp_path, "hung")
    wait_for_step(rdir, 15, 180)
    survivor, _ = wait_until("group 0's task", lambda: group_task(job, 0), 30)
    pid, stopped = wait_until("group 1's task", lambda: group_task(job, 1), 30)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    wait_until("the replacement to join", lambda: [e for e in events(rdir) if e.kind is Kind.REPLICA_JOIN], 180)
    assert os.path.exists(f"/proc/{survivor}"), "group 0's process never stopped"
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    (hang,) = [e for e in events(rdir) if e.kind is Kind.HANG]
    found_s = stamp_seconds(hang.time) - stopped_at
    assert found_s <= 10, (found_s, hang)
    assert (hang.rank, hang.node, hang.details.culprits, hang.details.nodes) == (1, stopped, [1], [stopped]), hang
    assert hang.details.reason.startswith("heartbeat:"), hang
    print(f"SIGSTOP in replica group 1 -> hang with its culprit on record: {found_s:.2f} s")
    # in place: a hang alone does not condemn its node (the node record counts it: health.node_record)
    assert_group_1_rejoined(job, rdir, survivor, stopped, in_place=True)


def test_a_flipped_bit_is_healed_from_the_other_group_which_trains_on_while_the_culprits_moves_to_the_spare(
        idle_cluster, tmp_path):
    reference(2, *TWIN)
    job = submit(tmp_path, "sdc", *DRIVEN, *GROUPS, "health.drain=true", "fault.sdc_step=30", "fault.sdc_rank=1",
                 f"cluster.exclude_file={tmp_path}/exclude.json")
    rdir = run_dir(tmp_path, "sdc")
    survivor, _ = wait_until("group 0's task", lambda: group_task(job, 0), 120)
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (sdc,) = [e for e in ev if e.kind is Kind.SDC]
    d = sdc.details
    assert sdc.step == 30 and d.ranks == [1] and d.action == "healed" and d.verified and d.decided_by == "rerun", d
    (bad,) = d.nodes
    state, reason = node_states(idle_cluster.state_dir)[bad]
    assert state.startswith("drain") and "sdc" in reason, (state, reason)
    assert exclude_list.load(str(tmp_path / "exclude.json"))[bad].reason.startswith("sdc: ")
    (heal,) = [e for e in ev if e.kind is Kind.REPLICA_HEAL]  # the moved group's, from group 0
    assert (heal.details.group, heal.details.source) == (1, 0) and heal.step >= sdc.step  # the state after the check
    assert_group_1_rejoined(job, rdir, survivor, bad)


def test_a_group_lost_with_no_spare_trains_on_without_it_then_joins_on_a_topped_up_spare(idle_cluster, tmp_path):
    """cluster.spare_topup=1 and no spare of the job's own: the driver asks Slurm for one in a job of
    its own at once. A test job holds the third node, so that job waits; group 1's rank is killed,
    group 0 trains on alone; the test's job is cancelled, the top-up job runs on the third node, and
    group 1 starts there, as a step of that job, heals from group 0 and joins. The top-up job is
    cancelled when the run ends. Nothing is faked."""
    twin = losses(reference(2, *TWIN))
    third = NODES[-1]
    blocker = idle_cluster.run("sbatch", "--parsable", "-w", third, "-c", "2", "--time=10", "--output=/dev/null",
                               "--wrap", "sleep 600").strip()
    idle_cluster.submitted.append(blocker)
    wait_until("the test's job to hold the third node", lambda: job_state(blocker)["JobState"] == "RUNNING", 60)
    # Paced so that group 0's steps alone outlast the leave, the top-up's start and group 1's heal.
    own = [a for a in DRIVEN if not a.startswith(("cluster.spare_nodes", "fault.step_sleep_s"))]
    job = submit(tmp_path, "topup", *own, *GROUPS, "cluster.spare_nodes=0", "cluster.spare_topup=1",
                 "fault.step_sleep_s=0.5")
    rdir = run_dir(tmp_path, "topup")
    wait_for_step(rdir, 20, 180, job)
    (asked,) = wait_until("the top-up asked for", lambda: [e for e in events(rdir) if e.kind is Kind.SPARE_TOPUP], 30)
    idle_cluster.submitted.append(asked.details.topup_job)
    assert asked.details.state == "asked" and job_state(asked.details.topup_job)["JobState"] == "PENDING"
    survivor, _ = wait_until("group 0's task", lambda: group_task(job, 0), 30)
    victim, dead = wait_until("group 1's task", lambda: group_task(job, 1), 30)
    os.kill(victim, signal.SIGKILL)
    wait_until("group 0 to go on alone", lambda: [e for e in events(rdir) if e.kind is Kind.REPLICA_LEAVE], 60)
    idle_cluster.run("scancel", blocker)
    wait_until("the replacement to join", lambda: [e for e in events(rdir) if e.kind is Kind.REPLICA_JOIN], 180)
    assert os.path.exists(f"/proc/{survivor}"), "group 0's process never stopped"
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    kinds = [e.kind for e in ev]
    assert job_state(job)["Restarts"] == "0" and Kind.REQUEUE not in kinds and Kind.RESUME not in kinds
    assert Kind.REPLICA_REFUSED not in kinds
    (start,) = [e for e in ev if e.kind is Kind.START]
    assert start.details.pids == [survivor]
    tops = [(e.details.state, e.details.topup_job, e.details.nodes) for e in ev if e.kind is Kind.SPARE_TOPUP]
    lender = asked.details.topup_job
    # Once group 1 took the lent node no spare was left, so the driver asked again: this cluster has
    # no fourth node, and sbatch said so (once: the run went on without spares).
    assert tops == [("asked", lender, []), ("granted", lender, [third]), ("refused", "", []),
                    ("given back", lender, [third])], tops
    (refused,) = [e for e in ev if e.kind is Kind.SPARE_TOPUP and e.details.state == "refused"]
    assert "Requested node configuration is not available" in refused.details.reason, refused
    (join,) = [e for e in ev if e.kind is Kind.REPLICA_JOIN]
    (heal,) = [e for e in ev if e.kind is Kind.REPLICA_HEAL]
    assert (heal.details.group, heal.details.source, heal.node) == (1, 0, third)
    assert (join.details.group, join.details.live, join.node) == (1, [0, 1], third) and join.job_id == job
    wait_until("the top-up job to end", lambda: job_state(lender)["JobState"] not in ("RUNNING", "PENDING"), 60)
    short = [r["step"] for r in map(json.loads, (rdir / "metrics.jsonl").read_text().splitlines())
             if r["replica_missing"]]
    assert short and max(short) <= join.step, short  # group 0 trained alone until the join
    got = losses(rdir)
    assert list(got) == list(range(1, STEPS + 1)) and not losses(rdir, "metrics-lost.jsonl")
    for step, loss in got.items():
        assert abs(loss - twin[step]) <= 1e-4 * abs(twin[step]), (step, loss, twin[step])
