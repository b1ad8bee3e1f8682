"""A checkpoint written by N ranks resumes on M (2 -> 1 and 1 -> 2): training continues with the same
global batch and the same data order.

Bit-identity across world sizes is not promised (a different number of ranks may sum gradients
and losses in a different order), so the losses are compared with a tolerance, and a negative
control shows the tolerance would catch a data order off by one batch.
"""

import json
import signal
import statistics
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import SHORT, SHORT_STEPS, events, finish, interrupt, launch, run_dir

pytestmark = pytest.mark.slow

GLOBAL_BATCH = 4  # data.global_batch_size in runs.SMALL
STOP_AT = 30


def metrics(rdir: Path) -> list[dict]:
    return [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(short_straight) -> list[dict]:
    return metrics(short_straight(1))


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_resume_on_another_world_size_keeps_global_batch_and_data_order(tmp_path, straight, before, after):
    rdir = run_dir(tmp_path, "resharded")
    code, out = interrupt(launch(tmp_path, "resharded", f"cluster.ranks={before}", *SHORT), rdir, STOP_AT,
                          signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch(tmp_path, "resharded", f"cluster.ranks={after}", *SHORT))
    assert code == ExitCode.DONE, out

    ev = events(rdir)
    (resume,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resume.details.saved_world_size == before and resume.step >= STOP_AT
    starts = [e.details.world_size for e in ev if e.kind is Kind.START]
    assert starts == [before, after]
    # A rank the checkpoint has no RNG states for seeds its own, and says so; the others restore theirs.
    assert [e.rank for e in ev if e.kind is Kind.RNG_RESEEDED] == list(range(before, after))

    # The data position is a global sample count: every checkpoint after the resume is exactly
    # step * global batch into the stream, whatever the world size that wrote it.
    ckpts = sorted((rdir / "checkpoints").glob("step_*"))
    resumed_after = [c for c in ckpts if int(c.name[5:]) > resume.step]
    assert resumed_after
    for ckpt in resumed_after:
        state = json.loads((ckpt / "train_state.json").read_text())
        assert state["data_state"]["samples_consumed"] == state["step"] * GLOBAL_BATCH
        assert state["world_size"] == after and state["data_state"]["global_batch_size"] == GLOBAL_BATCH

    # Same batches in the same order: each step's loss matches the uninterrupted run's.
    got = metrics(rdir)
    assert [r["step"] for r in got] == [r["step"] for r in straight] == list(range(1, SHORT_STEPS + 1))
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(straight, got)]
    assert max(diffs) <= 1e-5, f"step {diffs.index(max(diffs)) + 1}: loss differs by {max(diffs)}"
    # Negative control: one batch off is far outside that tolerance.
    off_by_one = statistics.mean(abs(a["loss"] - b["loss"]) for a, b in zip(straight[1:], got))
    assert off_by_one > 100 * max(max(diffs), 1e-5)
