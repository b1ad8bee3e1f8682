"""Pipelined runs through the launcher, on 4 gloo ranks: interrupted by SIGUSR1 (an emergency save)
and SIGKILL (a periodic checkpoint) at pp 2 x dp 2 and resumed each time, a run ends bit-identical to
its uninterrupted twin (each stage saves and loads its own layers, the checkpoint format holding
what every stage has); and a run
resharded from dp 2 into tp 2 x pp 2 and out to one rank trains the same global batches as a
straight run on one rank, its losses within 1e-4 relative, a NaN loss at tp 2 x pp 2 rolled back
past its data exactly as the straight run rolls back."""

import json
import signal
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import SMALL, assert_bit_identical, events, final_tensors, finish, interrupt, launch, run_dir

pytestmark = pytest.mark.slow

# A step at 4 ranks costs about a second here: runs short, checkpoints frequent.
STEPS = 24
EVERY = 4
# Two micro-batches of one row per data-parallel rank at dp 2: as many as the two stages.
OURS = [f"train.max_steps={STEPS}", f"checkpoint.every_steps={EVERY}", "data.micro_batch_size=1",
        "tracking.mode=disabled"]
BASE = [o for o in SMALL if o.split("=")[0] not in {k.split("=")[0] for k in OURS}] + OURS
PP = ["cluster.ranks=4", "parallel.pp=2"]


def losses(rdir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (rdir / "metrics.jsonl").read_text().splitlines())}


def test_pipelined_run_interrupted_twice_ends_bit_identical(tmp_path):
    code, out = finish(launch(tmp_path, "straight", *PP, base=BASE))
    assert code == ExitCode.DONE, out

    rdir = run_dir(tmp_path, "resumed")
    code, out = interrupt(launch(tmp_path, "resumed", *PP, base=BASE), rdir, 6, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(tmp_path, "resumed", *PP, base=BASE), rdir, 15, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(launch(tmp_path, "resumed", *PP, base=BASE))
    assert code == ExitCode.DONE, out

    assert_bit_identical(final_tensors(run_dir(tmp_path, "straight"), STEPS), final_tensors(rdir, STEPS))
    ev = events(rdir)
    stops = [e.step for e in ev if e.kind is Kind.STOP]
    resumes = [e.step for e in ev if e.kind is Kind.RESUME]
    assert resumes[:1] == stops and len(resumes) == 2 and ev[-1].kind is Kind.FINISH
    # after the SIGKILL (at step 15 or a little later), a periodic checkpoint from 12 on, or the
    # SIGUSR1's step 7 where step 12's async save was still being written when the kill came
    assert resumes[1] == stops[0] or (resumes[1] % EVERY == 0 and resumes[1] > stops[0])
    assert losses(rdir) == losses(run_dir(tmp_path, "straight"))


def test_resharding_into_and_out_of_tp2_pp2_keeps_the_global_batches(tmp_path):
    nan = [*BASE, "fault.nan_at_step=12", "monitor.rollback_skip_batches=5"]  # back to step 8, 5 batches skipped
    code, out = finish(launch(tmp_path, "straight", "cluster.ranks=1", base=nan))
    assert code == ExitCode.DONE, out

    rdir = run_dir(tmp_path, "resharded")
    code, out = interrupt(launch(tmp_path, "resharded", "cluster.ranks=2", base=nan), rdir, 5, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(tmp_path, "resharded", *PP, "parallel.tp=2", base=nan), rdir, 16, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch(tmp_path, "resharded", "cluster.ranks=1", base=nan))
    assert code == ExitCode.DONE, out

    ev = events(rdir)
    starts = [e.details.world_size for e in ev if e.kind is Kind.START]
    assert starts == [2, 4, 1]
    (rollback,) = [e for e in ev if e.kind is Kind.ROLLBACK]
    assert (rollback.details.anomaly_step, rollback.step) == (12, 8)
    assert [e.step for e in events(run_dir(tmp_path, "straight")) if e.kind is Kind.ROLLBACK] == [8]
    for ckpt in sorted((rdir / "checkpoints").glob("step_*")):
        state = json.loads((ckpt / "train_state.json").read_text())
        skipped = 5 if state["step"] > 8 else 0  # the rollback's
        assert state["data_state"]["samples_consumed"] == (state["step"] + skipped) * 4  # data.global_batch_size in runs.SMALL
    got, straight = losses(rdir), losses(run_dir(tmp_path, "straight"))
    assert sorted(got) == sorted(straight) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - straight[s]) / abs(straight[s]) for s in straight)
    assert worst <= 1e-4, worst
