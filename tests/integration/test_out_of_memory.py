"""Out of memory in real runs on CPU with 2 ranks (gloo).

- CUDA OOM (`fault.oom_at_step`, torch.OutOfMemoryError raised on rank 1 in a layer's forward): the
  step is redone at half the micro-batch, the run finishes, every step's loss matches an
  uninterrupted run's within LOSS_RTOL, and a start resumed from a checkpoint before the OOM keeps
  the smaller micro-batch (the fault fires only at the first one: it does not fire again).
- At micro-batch 1 the run gives up, saying what to do.
- Host OOM, for real: rank 1 leaks host memory (`fault.leak_mb_per_step`) inside a memory cgroup
  limited to 256 MiB; the kernel's OOM killer takes it. The leak is reported first, then the kill is
  recorded as `host_oom` with the kernel's line naming the pid, and no node is blamed.
"""

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health.oom_watch import memory_cgroup_dirs
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow
SHORT = ["cluster.ranks=2", "cluster.collective_timeout_s=60", "train.max_steps=16", "checkpoint.every_steps=4"]
LOSS_RTOL = 1e-5
"""Measured: half the micro-batch changes only the order of float32 sums (rows and ranks), which
moved the losses of these 16 steps by at most ~1e-7 relative (see the test's message); 1e-5 leaves
room for other CPUs' summation orders and still catches any wrong row or a gradient summed twice."""


def losses(rdir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (rdir / "metrics.jsonl").read_text().splitlines())}


def test_an_oom_is_redone_at_half_the_micro_batch_with_the_same_losses_and_a_resume_keeps_it(tmp_path):
    ref = launch(tmp_path, "ref", *SHORT)
    fault = ["fault.oom_at_step=6", "fault.ranks=[1]"]
    first = launch(tmp_path, "oom", *SHORT, *fault, "fault.step_sleep_s=0.3")
    rdir = run_dir(tmp_path, "oom")
    wait_for_step(first, rdir, 7)
    os.killpg(first.pid, signal.SIGKILL)  # after the retry, before the step-8 checkpoint
    finish(first)
    code, out = finish(launch(tmp_path, "oom", *SHORT, *fault))
    assert code == ExitCode.DONE, out
    assert finish(ref)[0] == ExitCode.DONE

    ev = events(rdir)
    (retry,) = [e for e in ev if e.kind is Kind.OOM_RETRY]  # the resumed start did not run out again
    d = retry.details
    assert (retry.step, d.ranks, d.old_micro_batch, d.new_micro_batch, d.configured_micro_batch, d.accumulation) == \
        (6, [1], 2, 1, 2, 2)
    assert "fault.oom_at_step=6" in d.error and [sorted(m) for m in d.memory] == [["max_rss_bytes", "rss_bytes"]] * 2
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.details.checkpoint.endswith("step_00000004")  # before the OOM: step 6 ran again, at 1
    assert "micro-batch 1 (data.micro_batch_size=2 ran out of memory earlier in the run)" in out
    state = json.loads((rdir / "checkpoints" / "step_00000016" / "train_state.json").read_text())
    assert state["micro_batch_size"] == 1

    want, got = losses(run_dir(tmp_path, "ref")), losses(rdir)
    assert sorted(got) == list(range(1, 17))
    assert all(got[s] == want[s] for s in range(1, 5))  # before it: the same micro-batch, bit for bit
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst <= LOSS_RTOL, f"largest relative loss difference {worst:.2e}"
    print(f"largest relative loss difference after the retry: {worst:.2e}")


def test_an_oom_at_micro_batch_1_gives_up_saying_what_to_do(tmp_path):
    code, out = finish(launch(tmp_path, "mb1", *SHORT, "data.micro_batch_size=1", "fault.oom_at_step=3",
                              "fault.ranks=[0]"))
    assert code == ExitCode.GAVE_UP, out
    ev = events(run_dir(tmp_path, "mb1"))
    (oom,) = [e for e in ev if e.kind is Kind.OUT_OF_MEMORY]
    assert (oom.step, oom.details.phase, oom.details.ranks, oom.details.micro_batch) == (3, "forward/backward", [0], 1)
    for remedy in ("model.activation_checkpointing=true", "shard over more ranks", "data.seq_len"):
        assert remedy in oom.details.reason
    (gave_up,) = [e for e in ev if e.kind is Kind.GAVE_UP]
    assert gave_up.details.reason == oom.details.reason and "giving up at step 3" in out
    assert not [e for e in ev if e.kind in (Kind.OOM_RETRY, Kind.CRASH)]


@pytest.fixture
def memcg():
    """A memory cgroup limited to 256 MiB, below this process's own (cgroup v1 here, v2 where mounted)."""
    mine = memory_cgroup_dirs()
    if os.geteuid() != 0 or not mine:
        pytest.skip("needs root and a memory cgroup hierarchy")
    path = Path(mine[0]) / f"rs-host-oom-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        limit = "memory.max" if (path / "memory.max").exists() else "memory.limit_in_bytes"
        (path / limit).write_text(str(256 << 20))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    yield path
    path.rmdir()


def test_a_rank_the_oom_killer_takes_is_a_host_oom_after_its_leak_was_reported(tmp_path, memcg):
    proc = launch(tmp_path, "leak", "cluster.ranks=2", "cluster.collective_timeout_s=60", "fault.ranks=[1]",
                  "fault.leak_mb_per_step=32", "fault.step_sleep_s=0.1", "monitor.rss_every_steps=1",
                  "monitor.leak_window=4", "monitor.leak_min_growth_mb=64", "cluster.kill_grace_s=10")
    rdir = run_dir(tmp_path, "leak")
    wait_for_step(proc, rdir, 1)
    (start,) = [e for e in events(rdir) if e.kind is Kind.START]
    victim = start.details.pids[1]
    # Only what rank 1 allocates from now on is charged to the cgroup: its leak, mostly.
    (memcg / "cgroup.procs").write_text(str(victim))
    code, out = finish(proc, timeout=120)
    assert code == ExitCode.FAILED, out

    ev = events(rdir)
    (exit_,) = [e for e in ev if e.kind is Kind.RANK_EXIT and e.details.failed_rank == 1]
    assert exit_.details.returncode == -signal.SIGKILL
    (oom,) = [e for e in ev if e.kind is Kind.HOST_OOM]
    assert (oom.details.killed_rank, oom.details.pid, oom.details.source) == (1, victim, "kernel_log")
    assert f"Killed process {victim} " in oom.details.evidence and memcg.name in oom.details.evidence
    leaks = [e for e in ev if e.kind is Kind.ANOMALY and e.details.kind == "memory_leak"]
    assert leaks and all(e.rank == 1 for e in leaks) and leaks[0].details.evidence["mb_per_step"] > 20
    assert not [e for e in ev if e.kind is Kind.NODE_UNHEALTHY]
