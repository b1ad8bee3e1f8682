"""A rank stopped with SIGSTOP is found by its heartbeats at the default settings, long before the
collectives' timeout, and named: the others wait in a collective it never entered. The local launcher
records the hang with every rank's stacks (and flight-recorder entries), ends the run, and a relaunch
resumes it. Real processes and a real SIGSTOP; nothing is faked."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow
HANG_BOUND_S = 10.0
"""The issue's bound on SIGSTOP -> the hang on record with its culprit, at the default settings."""


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


def test_a_stopped_rank_is_found_and_named_within_the_bound_at_the_default_settings(tmp_path):
    # 80 steps: the SIGSTOP lands near step 30, and the relaunch only has to show it resumes.
    extra = ["cluster.ranks=3", "data.global_batch_size=6", "cluster.collective_timeout_s=120", "fault.step_sleep_s=0.05",
             "train.max_steps=80", "tracking.mode=disabled"]
    proc = launch(tmp_path, "stopped", *extra)
    rdir = run_dir(tmp_path, "stopped")
    wait_for_step(proc, rdir, 30)
    os.kill(rank_pid(rdir, 1), signal.SIGSTOP)
    stopped_at = time.time()
    code, out = finish(proc)
    assert code == ExitCode.FAILED, out
    (hang,) = [e for e in events(rdir) if e.kind is Kind.HANG]
    found_s = stamp_seconds(hang.time) - stopped_at
    assert found_s <= HANG_BOUND_S, f"the hang was on record {found_s:.1f}s after the SIGSTOP"
    h = hang.details
    assert hang.rank == 1 and h.culprits == [1] and h.nodes == [os.uname().nodename], h
    assert h.reason.startswith("heartbeat: rank 1 silent") and "not alive" in h.reason, h.reason
    # The others wait in a collective rank 1 never entered (it was stopped before it issued it).
    c = h.collective
    assert c is not None and sorted(c["waiting"]) == [0, 2] and list(c["behind"]) == ["1"], c
    assert c["behind"]["1"] < c["seq"] and f"collective #{c['seq']}" in h.reason
    assert Path(h.stacks).is_file()
    for live in (0, 2):  # the live ranks dumped their stacks and their flight recorders
        assert list((rdir / "logs").glob(f"hang-rank{live}-step*.txt"))
        (recorded,) = (rdir / "logs").glob(f"hang-rank{live}-step*.flight-recorder.json")
        entries = json.loads(recorded.read_text())["entries"]
        assert any(e["collective_seq_id"] == c["seq"] and e["process_group"][0] == c["group"] for e in entries)
    print(f"SIGSTOP -> hang with its culprit on record: {found_s:.2f} s")

    code, out = finish(launch(tmp_path, "stopped", *extra))
    assert code == ExitCode.DONE, out
    assert [e for e in events(rdir) if e.kind is Kind.RESUME]
