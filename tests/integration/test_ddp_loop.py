"""A user's loop unlike examples/own_loop (tests/integration/ddp_loop.py: DDP, a DistributedSampler,
gradient accumulation, two parameter groups, dropout, the loss logged as a tensor) on 2 gloo ranks:
with a Session it computes bit for bit what it computes without one, and stopped by SIGUSR1
mid-epoch and launched again it ends bit-identical to the run never stopped. Real processes, real
signals; the loop waits at the step the signal is sent at (its test hook), nothing is faked."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.analysis.report import render
from resilient_slurm.analysis.summary import load, summarize
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration import ddp_loop
from tests.integration.runs import REPO, assert_bit_identical, events, final_tensors, finish

pytestmark = pytest.mark.slow

ENTRY = "tests.integration.ddp_loop:with_session"


def test_the_session_twin_equals_the_plain_loop_and_a_stop_mid_epoch_resumes_bit_identical(tmp_path):
    plain = run_plain(tmp_path / "plain.safetensors")
    code, out = finish(launch(tmp_path, "straight"))
    assert code == ExitCode.DONE, out
    straight = final_tensors(rdir(tmp_path, "straight"), ddp_loop.STEPS)
    ours = {k.split("/", 1)[1]: v for k, v in straight.items() if k.startswith("model/")}
    assert ours.keys() == plain.keys() and any("bias" in k for k in ours)
    for name in ours:  # the Session changed nothing the loop computes: dropout masks, data order, updates
        assert torch.equal(ours[name].view(torch.uint8), plain[name].view(torch.uint8)), name
    assert f"step {ddp_loop.STEPS}/{ddp_loop.STEPS} | loss" in out  # the trainer's step line, from s.log

    resumed, paused = rdir(tmp_path, "resumed"), tmp_path / "paused"
    proc = launch(tmp_path, "resumed", pause_at=13, paused=paused)
    wait_for(paused, proc)
    proc.send_signal(signal.SIGUSR1)
    code, out = finish(proc)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch(tmp_path, "resumed"))
    assert code == ExitCode.DONE, out
    assert_bit_identical(straight, final_tensors(resumed, ddp_loop.STEPS))
    ev = events(resumed)
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert stop.step == resume.step == 13  # 13 of 16 steps into the first epoch
    assert "finished at step 40/40" in render(summarize(load(resumed)))


def launch(root: Path, name: str, pause_at: int = 0, paused: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               **{ddp_loop.PAUSE_AT: str(pause_at), ddp_loop.PAUSED: str(paused or "")})
    return subprocess.Popen(
        [sys.executable, "-m", "resilient_slurm.launch", f"entry={ENTRY}", f"run.root={root}", "run.experiment=ddp_loop",
         f"run.name={name}", "cluster.ranks=2", "checkpoint.every_steps=10", "train.log_every_steps=10",
         "tracking.mode=disabled", "train.threads=1"],
        cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def rdir(root: Path, name: str) -> Path:
    return root / "ddp_loop" / name


def run_plain(out: Path) -> dict[str, torch.Tensor]:
    """The plain loop on 2 ranks, started as torchrun would start it (RANK, WORLD_SIZE, MASTER_*)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.ddp_loop", str(out)], cwd=REPO,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                                       PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])))
             for r in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    return load_file(out)


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until the loop says every rank waits at its step (or it ended, which fails the test)."""
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
