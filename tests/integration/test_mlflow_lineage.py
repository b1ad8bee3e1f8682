"""Acceptance: a run with tracking.backend=mlflow stopped by SIGUSR1, then SIGKILLed, then finished
is one MLflow run in the file store inside its run directory: every training metric has each
step once, strictly increasing, with metrics.jsonl's values and times; the ledger is mirrored once;
params, tags and artifacts are there; `report` names the run. Real processes, real signals, the
store read back with MLflow's own client. tracking.backend=none leaves no tracker files."""

import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime

import pytest

from resilient_slurm.rundir.metrics import read_metrics
from resilient_slurm.config import flatten
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.rundir.meta import read_meta
from resilient_slurm.tracking import mlflow_store
from tests.integration.runs import REPO, events, finish, interrupt, launch, run_dir

pytestmark = pytest.mark.slow
pytest.importorskip("mlflow")

# 60 steps, a checkpoint every 10, evaluation (validation rows, predictions tables) at 30 and 60.
SHORT = ["tracking.backend=mlflow", "train.max_steps=60", "checkpoint.every_steps=10", "eval.every_steps=30",
         "eval.task_samples=4", "data.val_samples=16"]
STEPS = list(range(1, 61))


def millis(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def test_two_interruptions_leave_one_mlflow_run_with_every_step_once(tmp_path):
    root = tmp_path / "runs"
    rdir = run_dir(root, "mlf")
    # Paced, so the SIGKILL at step 43 lands well before the step-50 checkpoint: steps are lost.
    paced = "fault.step_sleep_s=0.05"
    code, out = interrupt(launch(root, "mlf", *SHORT, paced), rdir, 15, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(root, "mlf", *SHORT, paced), rdir, 43, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(launch(root, "mlf", *SHORT, paced))
    assert code == ExitCode.DONE, out
    assert "did not start" not in out and "could not" not in out, out
    check_one_run(rdir)


def check_one_run(rdir):
    kept = read_metrics(rdir / "metrics.jsonl")
    assert [r["step"] for r in kept] == STEPS
    assert read_metrics(rdir / "metrics-lost.jsonl"), "the SIGKILL lost no steps: nothing was redone"

    client = mlflow_store.client(str(rdir / "mlruns"))
    experiment = client.get_experiment_by_name("tiny_sft")
    (run,) = client.search_runs([experiment.experiment_id])
    run_id = run.info.run_id
    assert mlflow_store.read_ids(rdir) == {"tracking_uri": None, "run_id": run_id}
    assert run.info.status == "FINISHED"

    # Every training metric: each step once, strictly increasing, the surviving timeline's values,
    # dated by when the step ran.
    assert mlflow_store.steps(client, run_id) == STEPS
    for key, name in [("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                      ("tokens_per_s", "perf/tokens_per_s"), ("step_seconds", "perf/step_seconds")]:
        history = client.get_metric_history(run_id, name)
        assert [m.step for m in history] == STEPS, name
        assert [m.value for m in history] == pytest.approx([r[key] for r in kept], rel=1e-12), name
        # Not the time of the commit that sent it (up to 10 steps later).
        assert all(abs(m.timestamp - millis(r["time"])) < 250 for m, r in zip(history, kept)), name
        assert len({m.timestamp for m in history}) == len(STEPS), name
    val = client.get_metric_history(run_id, "val/loss")
    assert [m.step for m in val] == [30, 60]
    assert [m.value for m in val] == pytest.approx([r["val_loss"] for r in kept if "val_loss" in r], rel=1e-12)

    # Every ledger event once; a count repeated at one step (events seen at close) holds its total last.
    mirrored = Counter()
    for key in run.data.metrics:
        if key.startswith("events/"):
            by_step = {}
            for m in client.get_metric_history(run_id, key):
                by_step[m.step] = max(by_step.get(m.step, 0.0), m.value)
            mirrored[key[len("events/"):]] = int(sum(by_step.values()))
    assert mirrored == Counter(e.kind.value for e in events(rdir))

    # Params (the flattened config), tags, artifacts.
    cfg = load_config(rdir)
    params = run.data.params
    assert params["optim.lr"] == "0.001" and params["model.hidden_size"] == "64"
    assert params.keys() == flatten(cfg).keys()
    tags = run.data.tags
    assert (tags["experiment"], tags["run"], tags["mlflow.runName"]) == ("tiny_sft", "mlf", "mlf")
    assert tags[mlflow_store.RUN_TAG] == read_meta(rdir)["run_id"]
    record = [line for line in (rdir / "record.jsonl").read_text().splitlines() if '"attempt"' in line]
    assert len(record) == 3 and tags.get("mlflow.source.git.commit", "") in record[-1]
    root_artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "eval", "events"} <= root_artifacts
    diffs = sorted(p.name for p in (rdir / "git").glob("*.diff"))
    assert [a.path for a in client.list_artifacts(run_id, "git")] == [f"git/{d}" for d in diffs]
    tables = [a.path for a in client.list_artifacts(run_id, "eval/exact_match_predictions")]
    assert tables == [f"eval/exact_match_predictions/step_{s:08d}.json" for s in (30, 60)]

    done = subprocess.run([sys.executable, "-m", "resilient_slurm.report", "--no-png", str(rdir)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"FINISHED, 60 step(s) logged through step 60; run {run_id} in {rdir / 'mlruns'}" in done.stdout
    assert f"mlflow ui --backend-store-uri {rdir / 'mlruns'}" in done.stdout


def test_backend_none_writes_no_tracker_files(tmp_path):
    root = tmp_path / "runs"
    rdir = run_dir(root, "untracked")
    code, out = finish(launch(root, "untracked", "tracking.backend=none", "train.max_steps=20"))
    assert code == ExitCode.DONE, out
    assert [r["step"] for r in read_metrics(rdir / "metrics.jsonl")] == list(range(1, 21))
    assert not {"mlruns", "mlflow", "wandb"} & {p.name for p in rdir.iterdir()}
