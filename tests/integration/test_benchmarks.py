"""Benchmarks beside training, end to end on the local launcher: a run with `eval.harness.every_steps`
starts an evaluation of its checkpoint at those steps and at the last one, trains on, and the real
lm-eval's scores of the shipped tiny tasks land in benchmarks.jsonl at the checkpoints' steps, in
the ledger and in the report, while metrics.jsonl keeps one row per step in order."""

import json
import time

import pytest

from resilient_slurm.analysis.report import render
from resilient_slurm.analysis.summary import load, summarize
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.rundir.benchmarks import latest_by_step, read_scores
from tests.integration.runs import events, finish, launch, run_dir

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow

HARNESS = ["eval.harness.tasks=[tiny_mmlu,tiny_gsm8k]", "eval.harness.every_steps=20", "eval.harness.limit=3",
           "eval.harness.dtype=float32", "checkpoint.every_steps=15", "train.max_steps=40"]


def wait_for_scores(rdir, steps, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(latest_by_step(read_scores(rdir / "benchmarks.jsonl"))) >= set(steps):
            return
        time.sleep(1)
    raise AssertionError(f"no scores for {steps} in {timeout_s} s: {[e.record for e in events(rdir)][-5:]}")


def test_scores_land_at_the_checkpoints_steps_while_training_goes_on(tmp_path):
    code, out = finish(launch(tmp_path, "bench", *HARNESS), timeout=300)
    assert code == ExitCode.DONE, out
    rdir = run_dir(tmp_path, "bench")
    launched = [e for e in events(rdir) if e.kind is Kind.EVAL_LAUNCHED]
    assert [e.step for e in launched] == [20, 40] and all(e.details.where == "local" for e in launched)
    # Step 20 is not a checkpoint step of the policy (every 15): the run saved it for the evaluation.
    saves = {e.step: e.details.reason for e in events(rdir) if e.kind is Kind.SAVE}
    assert saves[20] == "eval" and saves[15] == "periodic" and saves[40] == "final"
    # Training did not wait: step 21 was logged before the evaluation of step 20 ended.
    wait_for_scores(rdir, [20, 40])
    rows = [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    done = {e.step: e for e in events(rdir) if e.kind is Kind.EVAL_DONE}
    assert rows[20]["time"] < done[20].time
    scores = latest_by_step(read_scores(rdir / "benchmarks.jsonl"))
    for step in (20, 40):
        assert set(scores[step]) == {"tiny_mmlu/acc", "tiny_gsm8k/exact_match,strict-match",
                                     "tiny_gsm8k/exact_match,flexible-extract"}
        assert done[step].details.scores == scores[step]
    text = render(summarize(load(rdir)))
    assert "benchmarks  step 20: tiny_mmlu/acc" in text and "step 40: tiny_mmlu/acc" in text
    assert not list((rdir / "checkpoints" / ".pins").iterdir())  # every pin released
