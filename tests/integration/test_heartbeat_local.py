"""A rank stopped with SIGSTOP is found by its silence in seconds, long before the collectives' timeout:
the local launcher records the hang with every rank's stacks, ends the run, and a relaunch resumes
it. Real processes and a real SIGSTOP; nothing is faked."""

import os
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow


def rank_pid(rdir: Path, rank: int) -> int:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if b"resilient_slurm.runtime.rank" in argv and str(rdir).encode() in argv and f"RANK={rank}".encode() in env:
            return int(proc.name)
    raise AssertionError(f"no process for rank {rank} of {rdir}")


def test_a_stopped_rank_is_found_by_its_heartbeat_well_before_the_collective_timeout(tmp_path):
    extra = ["cluster.ranks=2", "cluster.collective_timeout_s=120", "fault.step_sleep_s=0.05"]
    proc = launch(tmp_path, "stopped", *extra, "monitor.heartbeat_timeout_s=10")
    rdir = run_dir(tmp_path, "stopped")
    wait_for_step(proc, rdir, 30)
    os.kill(rank_pid(rdir, 1), signal.SIGSTOP)
    code, out = finish(proc)
    assert code == ExitCode.FAILED, out
    (hang,) = [e for e in events(rdir) if e.kind is Kind.HANG]
    assert hang.rank == 1 and hang.details.reason.startswith("heartbeat: rank 1 silent")
    # Found by its heartbeat (the reason says so) after its 10 s, before the 120 s collective timeout.
    assert 10 <= hang.details.waited_s < 120 and Path(hang.details.stacks).is_file()
    assert list((rdir / "logs").glob("hang-rank0-*.txt")), "the live rank dumped its stacks too"

    code, out = finish(launch(tmp_path, "stopped", *extra))
    assert code == ExitCode.DONE, out
    assert [e for e in events(rdir) if e.kind is Kind.RESUME]
