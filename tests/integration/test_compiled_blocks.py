"""`model.compile=true`: each decoder layer compiled (inductor, on this CPU) under tensor parallelism
and FSDP2 (2 gloo ranks, tp 2), a run interrupted by SIGUSR1 and resumed ends bit-identical to its
uninterrupted twin, and its first loss is the eager run's within float tolerance (inductor fuses,
which changes the order of some float sums). Kept tiny: a compiled block's first step takes about a
minute here."""

import json
import signal

import pytest
import torch

from resilient_slurm.exit_codes import ExitCode
from tests.integration.runs import SMALL, finish, interrupt, launch, run_dir
from tests.integration.test_nd_runs import chunks

pytestmark = pytest.mark.slow

STEPS = 8
CHANGED = {"data.micro_batch_size": "1", "train.max_steps": str(STEPS), "checkpoint.every_steps": "4",
           "optim.warmup_steps": "2", "cluster.ranks": "2", "parallel.tp": "2", "tracking.mode": "disabled"}
RUN = [o for o in SMALL if o.partition("=")[0] not in CHANGED] + [f"{k}={v}" for k, v in CHANGED.items()]


def first_loss(rdir) -> float:
    return json.loads((rdir / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def test_compiled_blocks_under_tp_and_fsdp_resume_bit_identical(tmp_path):
    code, out = finish(launch(tmp_path, "straight", *RUN, "model.compile=true", base=[]), timeout=900)
    assert code == ExitCode.DONE, out
    rdir = run_dir(tmp_path, "resumed")
    code, out = interrupt(launch(tmp_path, "resumed", *RUN, "model.compile=true", base=[]), rdir, 3,
                          signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch(tmp_path, "resumed", *RUN, "model.compile=true", base=[]), timeout=900)
    assert code == ExitCode.DONE, out
    a, b = chunks(run_dir(tmp_path, "straight"), STEPS), chunks(rdir, STEPS)
    assert a.keys() == b.keys() and any("optimizer" in k for k in a)
    for k in a:
        assert torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), f"{k} differs"

    code, out = finish(launch(tmp_path, "eager", *RUN, "train.max_steps=1", "optim.warmup_steps=0",
                                 "checkpoint.save_final=false", base=[]))
    assert code == ExitCode.DONE, out
    assert first_loss(run_dir(tmp_path, "eager")) == pytest.approx(first_loss(rdir), rel=1e-4)
