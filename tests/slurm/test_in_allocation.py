"""Restarts inside the allocation on the real local cluster: the job's driver runs training as job
steps on two of its nodes and, when a node is lost, goes on without leaving the allocation: on a
spare, or on fewer nodes, or (below elastic.min_nodes) through a requeue without the node; a run
that shrank grows back once the node is returned to service. Every run ends bit-identical to an
uninterrupted one: at the same world size, or, after a shrink, to the uninterrupted run's
checkpoint continued on one rank (and, after growing back, on two again).

A node is "lost" here by SIGKILL of its task's process (the sandbox's nodes share one machine, so
a node cannot be switched off), or by an Xid line in its kernel log (per-node files, as in
test_node_health.py), and its disk by deleting its hot-tier directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import Kind
from resilient_slurm.session.rejoin import peer_gone
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, launch, run_dir
from tests.slurm.jobs import (
    STEPS,
    describe,
    driven_task,
    job_state,
    kill_driven_task,
    reference,
    submit,
    wait_for_end,
    wait_for_step,
    wait_until,
)
from tests.slurm.test_node_health import XID_LINES, node_states

pytestmark = pytest.mark.slurm

DRIVEN = ["cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.collective_timeout_s=60", "cluster.time_min=10",
          "fault.step_sleep_s=0.05", "tracking.mode=disabled"]
NODES = ("n1", "n2", "n3")


def of(ev, kind):
    return [e for e in ev if e.kind is kind]


def node_of(job, procid):
    return wait_until(f"task {procid} of job {job}", lambda: driven_task(job, procid), 60)[2]


def test_a_stopped_rank_is_found_and_named_within_10_s_at_the_default_settings(idle_cluster, tmp_path):
    """SIGSTOP of rank 1: neither its progress nor its liveness beats come. The driver's heartbeat
    monitor finds it within the issue's 10 s at the default settings (the collective timeout is 60 s),
    names it and its node (the other rank waits in a collective it never entered), and restarts
    every process (a hung rank cannot be told to rejoin)."""
    ref = reference(2)
    job = submit(tmp_path, "stopped", *DRIVEN, "cluster.spare_nodes=1")
    rdir = run_dir(tmp_path, "stopped")
    wait_for_step(rdir, 35, 120)
    pid = of(events(rdir), Kind.START)[-1].details.pids[1]
    stopped = node_of(job, 1)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (hang,) = of(ev, Kind.HANG)
    found_s = stamp_seconds(hang.time) - stopped_at
    h = hang.details
    assert found_s <= 10, (found_s, hang)
    assert hang.rank == 1 and hang.node == stopped and (h.culprits, h.nodes) == ([1], [stopped]), hang
    assert h.reason.startswith("heartbeat:") and h.collective["waiting"] == [0] and "1" in h.collective["behind"]
    print(f"SIGSTOP -> hang with its culprit on record: {found_s:.2f} s")
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    assert restart.details.path == "step" and "a hang" in restart.details.why, restart
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_after_a_cuda_class_error_every_process_restarts(idle_cluster, tmp_path):
    """Fault injected: the RuntimeError a CUDA illegal memory access raises, on rank 1 (no GPU here).
    The survivor's device state is not trusted after it: a step restart, in place, with why."""
    ref = reference(2)
    job = submit(tmp_path, "cuda", *DRIVEN, "cluster.spare_nodes=1", "fault.cuda_error_at_step=35", "fault.ranks=[1]")
    rdir = run_dir(tmp_path, "cuda")
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    r = restart.details
    assert (r.path, r.move, r.replaced, r.added) == ("step", "in place", [], []), r
    assert "CUDA-class error" in r.why and "illegal memory access" in r.why, r
    before, after = of(ev, Kind.START)
    assert not set(before.details.pids) & set(after.details.pids)  # every process anew
    assert r.breakdown["teardown"] is not None and r.breakdown["process_start"] is not None, r
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_a_crashed_rank_starts_anew_in_its_place_beside_the_survivor(idle_cluster, tmp_path):
    """Fault injected: an exception on rank 1 at step 35, on every attempt (a code bug). Its node is
    sound, so its replacement starts in its place, beside rank 0's step, which holds every CPU of
    its node (cluster.cpus_per_task=2 of 2): it must share them (srun --overlap), or it waits
    for them and every process restarts instead. The crash comes again: a code bug, given up."""
    job = submit(tmp_path, "inplace", *DRIVEN, "cluster.cpus_per_task=2", "cluster.spare_nodes=1",
                 "fault.raise_at_step=35", "fault.ranks=[1]")
    rdir = run_dir(tmp_path, "inplace")
    assert wait_for_end(job, rdir, 240) == "FAILED", describe(job, rdir)

    ev = events(rdir)
    nodes = of(ev, Kind.ATTEMPT)[0].details.nodes
    restarts = [e.details for e in of(ev, Kind.RESTART_IN_ALLOCATION)]
    assert restarts and all((r.path, r.move, r.replaced, r.added, r.nodes) == ("inprocess", "in place", [], [], nodes)
                            and r.latency_s < 30 for r in restarts), restarts  # 30 s: the driver's wait for srun
    starts = of(ev, Kind.START)
    assert len(starts) == len(restarts) + 1 and len({s.details.pids[0] for s in starts}) == 1  # rank 0 stayed
    assert len({s.details.pids[1] for s in starts}) == len(starts)  # rank 1 anew each time, on its node
    # Each crash recorded once, by the rank itself (srun's report of its exit is the same failure).
    crashes = of(ev, Kind.CRASH)
    assert len(crashes) == len(starts) and all(c.rank == 1 and c.node == nodes[1] and c.details.error.startswith(
        "InjectedFault: injected failure at step 35") for c in crashes), crashes
    (gave_up,) = of(ev, Kind.GAVE_UP)
    assert "code bug: the same failure after step 34 on every attempt" in gave_up.details.reason, gave_up


def test_an_xid_drains_the_node_and_the_run_continues_on_the_spare(idle_cluster, tmp_path):
    ref = reference(2)
    kmsg = tmp_path / "kmsg"
    kmsg.mkdir()
    for node in NODES:
        (kmsg / f"{node}.log").write_text("")
    job = submit(tmp_path, "xid", *DRIVEN, "cluster.spare_nodes=1", "health.check_every_s=2", "health.drain=true",
                 f"health.kernel_log={kmsg}/%n.log", f"cluster.exclude_file={tmp_path}/exclude.json")
    rdir = run_dir(tmp_path, "xid")
    wait_for_step(rdir, 30, 120)
    bad = node_of(job, 1)
    with open(kmsg / f"{bad}.log", "a") as f:
        f.write(f"[ 1234.567890] {XID_LINES[79]}\n")
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (unhealthy,) = of(ev, Kind.NODE_UNHEALTHY)
    assert unhealthy.details.bad_node == bad and unhealthy.details.xid == 79
    state, reason = node_states(idle_cluster.state_dir)[bad]
    assert state.startswith("drain") and "79" in reason, (state, reason)
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    assert restart.details.move == "spare" and restart.details.replaced == [bad]
    assert job_state(job)["Restarts"] == "0" and not of(ev, Kind.REQUEUE)
    (emergency,) = [e for e in of(ev, Kind.SAVE) if e.details.reason == "emergency"]
    (resume,) = of(ev, Kind.RESUME)
    # in the new start's step (the spare's standby, dismissed when the first start ended, took step 1)
    first, second = of(ev, Kind.ATTEMPT)
    assert resume.step == emergency.step and resume.job_step == second.job_step > first.job_step
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


KEEP_EVERY_CHECKPOINT = ("checkpoint.keep_last=20", "checkpoint.optimizer_on_last=0")
RESIZED = 100
RESIZED_STEPS = f"train.max_steps={RESIZED}"
"""The shrink and grow tests' length (more than jobs.STEPS): two restarts, each after a checkpoint of
its own, and steps after the last to end at the new size. Also the length their twins continue to."""


def continued(run: Path, step: int, root: Path, *legs: tuple[int, int], overrides: tuple[str, ...] = ()) -> Path:
    """`run`'s checkpoint of `step`, continued here on `ranks` ranks until step `until` (0: the end)
    for each (ranks, until) leg: what a run that changed its world size at those steps must equal,
    bit for bit. (`step` must still have its optimizer state: the newest two checkpoints do.)"""
    shutil.copytree(run.parents[1], root)
    twin = run_dir(root, run.name)
    for path in (twin / "checkpoints").glob("step_*"):
        if int(path.name.split("_")[1]) > step:
            shutil.rmtree(path)
    # Its ledger back to that step too: a run whose ledger says it finished is not run again.
    ledger = twin / "events.jsonl"
    ledger.write_text("".join(line for line in ledger.read_text().splitlines(keepends=True)
                              if json.loads(line)["event"] != "finish"))
    for ranks, until in legs:
        code, out = finish(launch(root, run.name, f"cluster.ranks={ranks}", "train.threads=1",
                                  f"train.pause_at_step={until}", *overrides))
        assert code == (ExitCode.RESUME if until else ExitCode.DONE), out
    return twin


def test_a_killed_rank_goes_on_on_the_spare_and_a_second_loss_shrinks_to_one_node_same_global_batch(
        idle_cluster, tmp_path):
    """The first kill: the survivor restarts in its own process (cluster.restart_in_process, the
    default); the killed rank's replacement is the process that stood by on the spare (cluster.standby,
    the default). The second, with no spare left: the run shrinks to one node (elastic.min_nodes=1)."""
    ref = reference(2, RESIZED_STEPS)
    job = submit(tmp_path, "shrink", *DRIVEN, RESIZED_STEPS, "cluster.spare_nodes=1", "cluster.elastic.min_nodes=1",
                 "fault.step_sleep_s=0.1")
    rdir = run_dir(tmp_path, "shrink")
    wait_for_step(rdir, 55, 150)
    dead = kill_driven_task(job, 1)  # resumes from 50 on the spare
    wait_until("the restarted run's checkpoint of step 75",
               lambda: [e for e in of(events(rdir), Kind.SAVE) if e.step == 75 and e.job_step == 1], 120, 0.1)
    # the spare is gone too: one node left (rank 1 is now the first task of the replacement's step)
    kill_driven_task(job, 0, job_step=1)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    assert job_state(job)["Restarts"] == "0" and not of(ev, Kind.REQUEUE)  # never left the allocation
    assert [r.details.move for r in of(ev, Kind.RESTART_IN_ALLOCATION)] == ["spare", "shrink"]
    saved_75 = next(i for i, e in enumerate(ev) if e.kind is Kind.SAVE and e.step == 75 and e.job_step == 1)
    _assert_on_the_spare(ev[:saved_75], dead, rdir)  # what was recorded before the second kill

    third = of(ev, Kind.ATTEMPT)[-1]
    assert third.job_step == 2 and third.details.ntasks == 1
    (start,) = [e for e in of(ev, Kind.START) if e.job_step == 2]
    (resume,) = [e for e in of(ev, Kind.RESUME) if e.job_step == 2]
    assert start.details.world_size == 1 and resume.details.saved_world_size == 2 and resume.step == 75
    # the model it shrank with is the uninterrupted run's, and so is the data position (steps x
    # global batch), on one rank as on two
    assert_bit_identical(final_tensors(ref, 75), final_tensors(rdir, 75))
    for step in (75, RESIZED):
        state = json.loads((rdir / "checkpoints" / f"step_{step:08d}" / "train_state.json").read_text())
        assert state["data_state"]["samples_consumed"] == step * 4 and state["world_size"] == (2 if step == 75 else 1)
    twin = continued(ref, 75, tmp_path / "twin", (1, 0), overrides=(RESIZED_STEPS,))
    assert_bit_identical(final_tensors(twin, RESIZED), final_tensors(rdir, RESIZED))


def _assert_on_the_spare(ev, dead: str, rdir: Path) -> None:
    """A run that lost rank 1's node `dead` went on with the spare in the same job, as `ev` records it."""
    first, second = of(ev, Kind.ATTEMPT)
    assert (first.restart, first.job_step, second.restart, second.job_step) == (0, 0, 0, 1)
    (spare,) = set(NODES) - set(first.details.nodes)
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    r = restart.details
    assert (r.move, r.replaced, r.added) == ("spare", [dead], [spare]) and sorted(r.nodes) == sorted(second.details.nodes)
    assert dead not in second.details.nodes and spare in second.details.nodes
    assert r.process_s == 0 and 0 < r.latency_s < 60, r  # no process had to start after the failure
    lost = [e for e in of(ev, Kind.CRASH) if e.node == dead]
    assert lost and lost[0].details.error.startswith(f"TaskLost: task 1 on {dead} ended without a trace (Killed)")
    # rank 0 went on in the process it had; rank 1's is new
    before, after = of(ev, Kind.START)
    assert after.details.pids[0] == before.details.pids[0] and after.details.pids[1] != before.details.pids[1]
    # the same process start (read from /proc at each start: to the millisecond, not exactly)
    assert abs(stamp_seconds(after.details.process_starts[0]) - stamp_seconds(before.details.process_starts[0])) < 0.5
    # rank 1's new process stood by on the spare since the job began, and was woken after the kill
    assert stamp_seconds(after.details.process_starts[1]) < stamp_seconds(r.failed_at)
    standby = [json.loads(p.read_text()) for p in (rdir / "slurm" / "rejoin").glob(f"*.standby-{second.job_step}.json")]
    assert standby == [{"generation": 1}]
    (waited,) = of(ev, Kind.PEER_LOST)
    # gloo says "Connection closed by peer" or "... reset by peer", depending on which end saw it first
    assert waited.rank == 0 and waited.details.generation == 1 and peer_gone(RuntimeError(waited.details.error))
    assert not [e for e in of(ev, Kind.CRASH) if e.rank == 0]  # a peer's death is not the survivor's crash
    assert r.path == "inprocess" and r.why is None, r
    b = r.breakdown
    assert set(b) == {"detect", "teardown", "placement", "process_start", "rendezvous", "load", "data_ready",
                      "first_step", "load_source"}, b
    assert all(b[k] is not None and 0 <= b[k] < r.latency_s for k in b if k != "load_source"), b
    assert b["load_source"] == "hot"


def test_a_shrunk_run_grows_back_at_a_checkpoint_once_its_node_is_returned_to_service(idle_cluster, tmp_path):
    kmsg, exclude = tmp_path / "kmsg", tmp_path / "exclude.json"
    kmsg.mkdir()
    for node in NODES:
        (kmsg / f"{node}.log").write_text("")
    job = submit(tmp_path, "grow", *DRIVEN, RESIZED_STEPS, *KEEP_EVERY_CHECKPOINT, "cluster.elastic.min_nodes=1",
                 "health.check_every_s=2", "health.drain=true", f"health.kernel_log={kmsg}/%n.log",
                 f"cluster.exclude_file={exclude}")
    rdir = run_dir(tmp_path, "grow")
    wait_for_step(rdir, 30, 120)
    bad = node_of(job, 1)
    with open(kmsg / f"{bad}.log", "a") as f:
        f.write(f"[ 1234.567890] {XID_LINES[79]}\n")
    wait_until("the run to continue on one node", lambda: of(events(rdir), Kind.RESTART_IN_ALLOCATION), 120, 0.1)
    # The repair done, a person returns the node to service: a clean log, off the list, resumed.
    (kmsg / f"{bad}.log").write_text("")
    exclude_list.clear(str(exclude), [bad], time.time())
    idle_cluster.run("scontrol", "update", f"nodename={bad}", "state=resume")
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    shrink, grow = of(ev, Kind.RESTART_IN_ALLOCATION)
    assert (shrink.details.move, shrink.details.replaced) == ("shrink", [bad])
    assert (grow.details.move, grow.details.replaced, grow.details.added) == ("grow", [], [bad])
    assert sorted(grow.details.nodes) == sorted(of(ev, Kind.ATTEMPT)[0].details.nodes) and 0 < grow.details.latency_s
    assert [s.details.signal for s in of(ev, Kind.SIGNAL)] == ["SIGUSR2"]  # the driver's stop, not a time limit
    assert job_state(job)["Restarts"] == "0" and not of(ev, Kind.REQUEUE)
    assert [(a.job_step, a.details.ntasks) for a in of(ev, Kind.ATTEMPT)] == [(0, 2), (1, 1), (2, 2)]
    resumed = {e.job_step: e for e in of(ev, Kind.RESUME)}
    shrunk_at, grown_at = resumed[1].step, resumed[2].step
    assert (resumed[1].details.saved_world_size, resumed[2].details.saved_world_size) == (2, 1)
    for step, world_size in ((shrunk_at, 2), (grown_at, 1), (RESIZED, 2)):
        state = json.loads((rdir / "checkpoints" / f"step_{step:08d}" / "train_state.json").read_text())
        assert (state["data_state"]["samples_consumed"], state["world_size"]) == (step * 4, world_size), step
    # From the checkpoint it shrank with (the tests above check the state a run shrinks with), on
    # one rank until it grew back and on two after it: the models of a local run resized there.
    twin = continued(rdir, shrunk_at, tmp_path / "twin", (1, grown_at), (2, 0),
                     overrides=(RESIZED_STEPS, *KEEP_EVERY_CHECKPOINT))
    assert_bit_identical(final_tensors(twin, grown_at), final_tensors(rdir, grown_at))
    assert_bit_identical(final_tensors(twin, RESIZED), final_tensors(rdir, RESIZED))


def test_without_a_spare_below_min_nodes_the_job_requeues_without_the_lost_node(idle_cluster, tmp_path):
    ref = reference(2)
    job = submit(tmp_path, "requeued", *DRIVEN, "cluster.elastic.min_nodes=2")
    rdir = run_dir(tmp_path, "requeued")
    wait_for_step(rdir, 35, 120)
    dead = kill_driven_task(job, 1)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (requeue,) = of(ev, Kind.REQUEUE)
    assert requeue.details.ok and requeue.details.exclude == [dead] and requeue.details.exclude_ok, requeue
    assert "fewer than the 2 needed" in requeue.details.reason
    attempts = of(ev, Kind.ATTEMPT)
    assert [a.restart for a in attempts] == [0, 1] and dead not in attempts[1].details.nodes
    assert not of(ev, Kind.RESTART_IN_ALLOCATION) and job_state(job)["Restarts"] == "1"
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))


def test_the_restart_reads_the_buddy_copy_when_the_dead_nodes_disk_is_gone(idle_cluster, tmp_path):
    ref = reference(2)
    hot = tmp_path / "hot"
    # Every process restarts (rank 0 reads the files its buddy holds of the dead node's shard)
    job = submit(tmp_path, "buddy", *DRIVEN, "cluster.spare_nodes=1", f"checkpoint.hot_dir={hot}/%n",
                 "cluster.restart_in_process=false")
    rdir = run_dir(tmp_path, "buddy")
    wait_for_step(rdir, 35, 120)
    dead = node_of(job, 1)
    shutil.rmtree(hot / dead)  # the node's disk, then the node
    kill_driven_task(job, 1)
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    copies = of(ev, Kind.BUDDY_COPY)
    assert copies and all(c.details.ok for c in copies[:2]), copies
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    assert restart.details.replaced == [dead]
    (resume,) = of(ev, Kind.RESUME)
    assert resume.details.source == "buddy" and resume.job_step == 1
    # every file of the final checkpoint was brought to rank 0's node
    first_node = sorted(of(ev, Kind.ATTEMPT)[-1].details.nodes)[0]
    assert_bit_identical(final_tensors(ref, STEPS),
                         final_tensors(rdir, STEPS, hot_root=hot / first_node / "tiny_sft" / "buddy"))
