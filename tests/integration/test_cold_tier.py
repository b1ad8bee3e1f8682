"""Hot tier on a (node-local) directory, cold tier on an S3-compatible object store: checkpoints are
copied to the store in the background and verified there; when the hot tier is lost (a replacement
node's empty disk), the run resumes from the store and ends bit-identical to an uninterrupted one.

The store is moto's S3 server on loopback, in the test process; the runs reach it through the
standard AWS_* environment variables.
"""

import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import (
    SHORT,
    SHORT_STEPS,
    assert_bit_identical,
    events,
    final_tensors,
    finish,
    interrupt,
    launch,
    run_dir,
)
from tests.s3_server import s3_bucket

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    with s3_bucket() as (fs, url):
        yield fs, f"{url}/runs"


def hot_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update({f"{f.stem.split('-')[0]}/{k}": v for k, v in load_file(f).items()})
    return out


def test_hot_tier_lost_resumes_from_the_object_store_bit_identical(tmp_path, s3, short_straight):
    fs, url = s3
    hot = tmp_path / "node-local"
    tiers = [*SHORT, f"checkpoint.hot_dir={hot}", f"checkpoint.cold.url={url}", "checkpoint.cold.keep_last=3"]
    rdir = run_dir(tmp_path, "tiered")
    code, out = interrupt(launch(tmp_path, "tiered", *tiers), rdir, 45, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    ev = events(rdir)
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    (plan,) = [e for e in ev if e.kind is Kind.EMERGENCY_PLAN]
    assert plan.details.plan == "full+cold", plan  # 120 s of lead time: the whole state, copied before exit
    copies = {e.step: e for e in ev if e.kind is Kind.COLD_COPY}
    assert stop.step in copies and copies[stop.step].details.verified
    assert not (rdir / "checkpoints").exists() or not any((rdir / "checkpoints").iterdir()), "saved outside the hot tier"
    cold_run = f"{url[len('s3://'):]}/tiny_sft/tiered"
    in_cold = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(cold_run, detail=False, refresh=True))
    assert len(in_cold) == 3 and in_cold[-1] == f"step_{stop.step:08d}", in_cold  # cold retention kept 3

    shutil.rmtree(hot)  # the job comes back on a node with an empty local disk
    code, out = finish(launch(tmp_path, "tiered", *tiers))
    assert code == ExitCode.DONE, out
    ev = events(rdir)
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.details.source == "cold" and resume.step == stop.step
    final = hot / "tiny_sft" / "tiered" / f"step_{SHORT_STEPS:08d}"
    assert verify(final).ok
    assert_bit_identical(final_tensors(short_straight(1), SHORT_STEPS), hot_tensors(final))
    copied = {e.step for e in ev if e.kind is Kind.COLD_COPY}
    assert SHORT_STEPS in copied, "the final checkpoint never reached the cold tier"
