"""On the sandbox cluster, a run's benchmark evaluation is a Slurm job of its own (not a step of the
training job), and its scores land back in the run at the checkpoint's step."""

from __future__ import annotations

import time

import pytest

from resilient_slurm.ledger import Kind
from resilient_slurm.rundir.benchmarks import latest_by_step, read_scores
from tests.integration.runs import events, run_dir
from tests.slurm.jobs import describe, submit, wait_for_end

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slurm


def test_the_evaluation_is_a_separate_job_and_its_scores_land_in_the_run(slurm_cluster, tmp_path):
    job = submit(tmp_path, "bench", "train.max_steps=40", "checkpoint.every_steps=20",
                 "eval.harness.tasks=[tiny_mmlu]", "eval.harness.every_steps=20", "eval.harness.limit=3",
                 "eval.harness.dtype=float32", "eval.harness.gpus=0", "eval.harness.time_min=10")
    rdir = run_dir(tmp_path, "bench")
    assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)
    launched = [e for e in events(rdir) if e.kind is Kind.EVAL_LAUNCHED]
    assert [e.step for e in launched] == [20, 40] and all(e.details.where == "slurm" for e in launched)
    side_jobs = {e.details.eval_job_id for e in launched}
    assert len(side_jobs) == 2 and job not in side_jobs
    deadline = time.monotonic() + 300
    while set(latest_by_step(read_scores(rdir / "benchmarks.jsonl"))) < {20, 40} and time.monotonic() < deadline:
        time.sleep(2)
    rows = read_scores(rdir / "benchmarks.jsonl")
    assert {r["step"] for r in rows} == {20, 40}, [e.record for e in events(rdir)][-4:]
    assert {r["where"] for r in rows} == {f"slurm:{j}" for j in side_jobs}
    assert all("tiny_mmlu/acc" in r["scores"] for r in rows)
