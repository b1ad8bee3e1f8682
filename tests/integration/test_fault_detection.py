"""In-training faults on CPU with 2 ranks (gloo): a NaN loss rolls back past its data, a hung rank
is caught by the watchdog with every rank's stacks, and a slow rank is named."""

import json

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.data.batches import SampleStream
from tests.integration.runs import events, finish, launch, run_dir

pytestmark = pytest.mark.slow
TWO = ["cluster.ranks=2", "cluster.collective_timeout_s=60"]


def test_nan_rolls_back_past_the_bad_data_and_the_run_finishes(tmp_path):
    code, out = finish(launch(tmp_path, "nan", *TWO, "fault.nan_at_step=60", "monitor.rollback_skip_batches=20"))
    assert code == ExitCode.DONE, out
    ev = events(run_dir(tmp_path, "nan"))
    (anomaly,) = [e for e in ev if e.kind is Kind.ANOMALY and e.details.kind == "loss_nan"]
    assert anomaly.step == 60 and anomaly.details.action == "rollback"
    (rollback,) = [e for e in ev if e.kind is Kind.ROLLBACK]
    assert rollback.details.anomaly_step == 60 and rollback.step == 50  # the periodic checkpoint before it
    assert rollback.details.checkpoint.endswith("step_00000050")
    g = 4  # global batch of the test config
    assert rollback.details.skipped_batches == 20 and rollback.details.skipped_positions == [50 * g, 70 * g]
    (data,) = [e for e in ev if e.kind is Kind.DATA_READY]  # the rows the sampler draws from
    assert rollback.details.skipped_samples == SampleStream(data.details.rows, 1234).indices(50 * g, 20 * g)
    assert ev[-1].kind is Kind.FINISH and ev[-1].step == 200
    rows = [json.loads(line) for line in (run_dir(tmp_path, "nan") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 201))  # the lost steps' lines were dropped
    assert all(r["loss"] == r["loss"] for r in rows)  # no NaN survived in the record


def test_a_hung_rank_is_caught_with_every_ranks_stacks_within_the_timeout(tmp_path):
    code, out = finish(launch(tmp_path, "hang", *TWO, "fault.hang_at_step=30", "fault.ranks=[1]",
                              "monitor.hang_floor_s=4", "monitor.hang_first_step_s=60"), timeout=120)
    assert code == ExitCode.FAILED, out
    rdir = run_dir(tmp_path, "hang")
    ev = events(rdir)
    hangs = [e for e in ev if e.kind is Kind.HANG]
    assert hangs and all(e.step == 29 and 4 <= e.details.waited_s < 30 for e in hangs)
    dumped = {e.rank for e in ev if e.kind in (Kind.HANG, Kind.STACKS_DUMPED)}
    assert dumped == {0, 1}  # the first rank to fire made the other dump its stacks too
    stuck = (rdir / "logs" / "hang-rank1-step29.txt").read_text()
    assert "faults.py" in stuck and "before_step" in stuck  # rank 1 is in the injected hang
    waiting = (rdir / "logs" / "hang-rank0-step29.txt").read_text()
    assert "trainer/step.py" in waiting  # rank 0 waits for rank 1 inside the step's collectives


def test_a_slow_rank_is_named(tmp_path):
    code, out = finish(launch(tmp_path, "slow", *TWO, "train.max_steps=40", "fault.step_sleep_s=0.15",
                              "fault.ranks=[1]"))
    assert code == ExitCode.DONE, out
    slow = [e for e in events(run_dir(tmp_path, "slow")) if e.kind is Kind.ANOMALY and e.details.kind == "slow_rank"]
    assert slow and {e.details.evidence["rank"] for e in slow} == {1}
    assert slow[0].details.evidence["seconds"] > 2 * slow[0].details.evidence["others_median"]
