"""A stop signal that reaches only one of two ranks makes both save the same step."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.session.rejoin import PEER_GONE
from tests.integration.runs import REPO, events, finish, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=", 1)[1])


@pytest.mark.parametrize("target_rank", [1, 0])
def test_signal_to_one_rank_saves_the_same_step_on_both(tmp_path, target_rank):
    rdir = run_dir(tmp_path, "one")
    proc = launch(tmp_path, "one", "cluster.ranks=2")
    wait_for_step(proc, rdir, 30)
    ranks = {rank_of(p): p for p in children(proc.pid)}
    os.kill(ranks[target_rank], signal.SIGUSR2)
    code, out = finish(proc)
    assert code == ExitCode.RESUME, out

    ev = events(rdir)
    sig = [e for e in ev if e.kind is Kind.SIGNAL]
    assert [(e.rank, e.details.signal) for e in sig] == [(target_rank, "SIGUSR2")]
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    ckpt = Path(stop.details.checkpoint)
    assert ckpt.name == f"step_{stop.step:08d}" and stop.step == sig[0].step
    verdict = verify(ckpt)
    assert verdict.ok, verdict.reason
    assert verdict.manifest.world_size == 2
    assert {"rng/rank-00000.json", "rng/rank-00001.json"} <= set(verdict.manifest.files)
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == stop.step


def test_a_rank_killed_with_sigkill_is_named_in_one_line_and_the_report_blames_it(tmp_path):
    """Issue 27, item 9: the survivor's gloo traceback ("Connection reset by peer ... GLHF!") stays in
    its log; the console's last line names the dead rank, the signal and the step a relaunch resumes
    from; the report blames the kill, not the survivor's RuntimeError."""
    rdir = run_dir(tmp_path, "k9")
    proc = launch(tmp_path, "k9", "cluster.ranks=2")
    wait_for_step(proc, rdir, 30)
    ranks = {rank_of(p): p for p in children(proc.pid)}
    os.kill(ranks[1], signal.SIGKILL)
    code, out = finish(proc)
    assert code == ExitCode.FAILED, out
    assert "Traceback" not in out and "GLHF" not in out, out
    saves = [e.step for e in events(rdir) if e.kind is Kind.SAVE]
    assert saves and verify(rdir / "checkpoints" / f"step_{saves[-1]:08d}").ok
    assert out.splitlines()[-1] == (f"resilient_slurm: rank 1 was killed by signal 9 (SIGKILL); rank 0 stopped with "
                                    f"it (logs/rank-0.log); launch again to resume from step {max(saves)}")
    log = (rdir / "logs" / "rank-0.log").read_text()
    assert "Traceback" in log and any(marker in log for marker in PEER_GONE)  # the survivor's gloo error
    # Issue 27, item 18: details a user needs only when something goes wrong are in the log, not on the console.
    for detail in ("CPU thread(s) per rank", "GPU metrics off", "run directory: "):
        assert detail in log and detail not in out, detail
    report = subprocess.run([sys.executable, "-m", "resilient_slurm.report", str(rdir), "--no-png"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert "killed: rank 1 by signal 9 (SIGKILL)" in report.stdout and "crashed" not in report.stdout, report.stdout
