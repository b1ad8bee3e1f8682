"""A stop signal that reaches only one of two ranks makes both save the same step."""

import json
import os
import signal
from pathlib import Path

import pytest

from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

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
