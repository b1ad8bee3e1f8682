"""The MLflow sink against real MLflow (mlflow-skinny), read back with MLflow's own client: the
processes of a run make one MLflow run whose steps are each logged once, with the ledger mirrored
once, params, tags and artifacts; a run killed right after its sends is repaired by the next one."""

import json
import os
from collections import Counter
from datetime import datetime

import pytest

from resilient_slurm.rundir.metrics import MetricsFile, read_metrics
from resilient_slurm.config import Config, flatten
from resilient_slurm.launch.prepare import prepare
from resilient_slurm.rundir.meta import read_meta
from resilient_slurm.ledger import EventLog, Finish, Resume, Save, Start, Stop, read_events
from resilient_slurm.tracking import Table, mlflow_store, open_tracker
from resilient_slurm.tracking.committed import CommittedHistory
from resilient_slurm.tracking.mlflow_sink import MlflowSink

pytest.importorskip("mlflow")


def segment(cfg, run_dir, steps, commit, code, resumed_from=None, kill_after_commit=False):
    """One process of the run: what job.py does with the tracker, without the training."""
    ledger = EventLog(run_dir / "events.jsonl")
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    tracker = open_tracker(cfg, run_dir, 0)
    assert isinstance(tracker, CommittedHistory) and isinstance(tracker.sink, MlflowSink)
    ledger.emit(Start(world_size=1, pid=os.getpid(), host="here"), 0)
    if resumed_from is not None:
        metrics.truncate_after(resumed_from)
        ledger.emit(Resume(checkpoint=f"step_{resumed_from}", has_optimizer=True, source="hot", saved_world_size=1),
                    resumed_from)
    for step in steps:
        row = {"step": step, "loss": 1.0 / step + (resumed_from or 0)}
        metrics.append(row)
        tracker.log(step, row)
        if step == 6:
            tracker.log(step, {"eval/exact_match_predictions": Table(["step", "prediction"], [[step, "yes"]])})
        if step == commit:
            ledger.emit(Save(reason="periodic", mode="sync", path=f"step_{step}", bytes=1, seconds=0.1, blocking_s=0.1,
                             has_optimizer=True), step)
            tracker.commit(step)
            if kill_after_commit:
                return  # SIGKILLed: no close
    ledger.emit(Stop(reason="SIGUSR1", checkpoint=None) if code else Finish(tokens_seen=len(steps)), steps[-1])
    tracker.close(code)


@pytest.fixture
def cfg(tmp_path):
    """The default store: files in the run directory."""
    cfg = Config()
    cfg.run.root, cfg.run.experiment, cfg.run.name = str(tmp_path / "runs"), "exp", "r"
    cfg.tracking.backend, cfg.tracking.tags = "mlflow", ["nightly"]
    return cfg


@pytest.fixture
def sqlite_cfg(cfg, tmp_path):
    """A SQLite store; creating one runs MLflow's schema migrations (10 s to over a minute here)."""
    pytest.importorskip("alembic")
    cfg.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return cfg


def read_back(cfg, run_dir):
    client = mlflow_store.client(mlflow_store.store_uri(cfg.tracking.uri, run_dir))
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    return client, runs


def test_three_processes_make_one_run_with_each_step_once(cfg):
    three_processes_make_one_run_with_each_step_once(cfg)


@pytest.mark.slow
def test_the_same_in_a_sqlite_store(sqlite_cfg, tmp_path, monkeypatch):
    (tmp_path / "job").mkdir()
    monkeypatch.chdir(tmp_path / "job")
    three_processes_make_one_run_with_each_step_once(sqlite_cfg)
    # The artifacts sit beside the database, not in the directory the job ran in.
    assert (tmp_path / "mlartifacts").is_dir() and not any((tmp_path / "job").iterdir())


def three_processes_make_one_run_with_each_step_once(cfg):
    run_dir, _ = prepare(cfg, [])
    segment(cfg, run_dir, range(1, 11), commit=5, code=75)
    # Killed right after its commit at 8 (no close); the next resumes from 3, an older checkpoint:
    # 4..8 are already in MLflow, so their recomputed values stay out of the run.
    segment(cfg, run_dir, range(6, 10), commit=8, code=0, resumed_from=5, kill_after_commit=True)
    segment(cfg, run_dir, range(4, 13), commit=12, code=0, resumed_from=3)

    client, runs = read_back(cfg, run_dir)
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    assert mlflow_store.read_ids(run_dir) == {"tracking_uri": cfg.tracking.uri, "run_id": run_id}
    assert runs[0].info.status == "FINISHED"
    loss = client.get_metric_history(run_id, "train/loss")
    assert [m.step for m in loss] == list(range(1, 13))
    assert [m.value for m in loss] == pytest.approx([1.0 / s for s in range(1, 6)] +
                                                    [1.0 / s + 5 for s in range(6, 9)] +
                                                    [1.0 / s + 3 for s in range(9, 13)])
    assert mlflow_store.steps(client, run_id) == list(range(1, 13))
    # Points are dated by when their step ran (metrics.jsonl's time), not by the commit.
    ran = {r["step"]: datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() * 1000
           for r in read_metrics(run_dir / "metrics.jsonl")}
    assert all(abs(m.timestamp - ran[m.step]) < 50 for m in loss if m.step >= 9)

    mirrored = Counter()
    for key in runs[0].data.metrics:
        if key.startswith("events/"):
            history = client.get_metric_history(run_id, key)
            mirrored[key[len("events/"):]] = sum(m.value for m in history)
            assert len({m.step for m in history}) == len(history), key  # no re-sent point here
    assert mirrored == Counter(e.kind.value for e in read_events(run_dir / "events.jsonl"))

    data = runs[0].data
    assert data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(cfg).items()}
    assert data.tags["experiment"] == "exp" and data.tags["run"] == "r" and data.tags["nightly"] == ""
    assert data.tags[mlflow_store.RUN_TAG] == read_meta(run_dir)["run_id"]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "eval", "events"} <= artifacts
    table = json.loads(open(client.download_artifacts(
        run_id, "eval/exact_match_predictions/step_00000006.json", str(run_dir))).read())
    assert table == {"columns": ["step", "prediction"], "data": [[6, "yes"]]}
    ledger_tables = [a.path for a in client.list_artifacts(run_id, "events/ledger")]
    # The first process's stop (seen at close) joined the table of its last row sent, step 5.
    assert ledger_tables == [f"events/ledger/step_{s:08d}.json" for s in (5, 8, 12)]
    first = json.loads(open(client.download_artifacts(run_id, ledger_tables[0], str(run_dir))).read())
    assert [row[1] for row in first["data"]] == ["start", "save", "stop"]


def test_events_at_close_repeating_a_kind_add_to_the_last_row(cfg):
    """A save seen at close, at the step of the last row sent, which already counts one: MLflow
    cannot change a point, so the new total is a later point at that step."""
    run_dir, _ = prepare(cfg, [])
    ledger = EventLog(run_dir / "events.jsonl")
    tracker = open_tracker(cfg, run_dir, 0)
    save = Save(reason="periodic", mode="async", path="p", bytes=1, seconds=0.1, blocking_s=0.0, has_optimizer=True)
    tracker.log(1, {"loss": 2.0})
    ledger.emit(save, 1)
    tracker.commit(1)
    ledger.emit(save, 1)
    tracker.close(0)
    client, (run,) = read_back(cfg, run_dir)
    saves = client.get_metric_history(run.info.run_id, "events/save")
    assert [(m.step, m.value) for m in saves] == [(1, 1.0), (1, 2.0)]
    assert run.data.metrics["events/save"] == 2.0
    assert mlflow_store.steps(client, run.info.run_id) == [1]
    table = json.loads(open(client.download_artifacts(run.info.run_id, "events/ledger/step_00000001.json",
                                                      str(run_dir))).read())
    assert [row[1] for row in table["data"]] == ["save", "save"]


def test_a_stop_leaves_the_run_scheduled_and_git_state_is_logged(cfg):
    run_dir, _ = prepare(cfg, [])
    diff = run_dir / "git" / "abc-1234.diff"
    diff.parent.mkdir()
    diff.write_text("--- a\n+++ b\n")
    (run_dir / "record.jsonl").write_text(json.dumps(
        {"kind": "attempt", "git": {"commit": "c0ffee", "branch": "main", "diff": "git/abc-1234.diff"}}) + "\n")
    segment(cfg, run_dir, range(1, 4), commit=2, code=75)
    client, (run,) = read_back(cfg, run_dir)
    assert run.info.status == "SCHEDULED"
    assert run.data.tags["mlflow.source.git.commit"] == "c0ffee"
    assert run.data.tags["mlflow.source.git.branch"] == "main"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "git")] == ["git/abc-1234.diff"]


def test_a_lost_run_id_finds_the_run_by_its_tag(cfg):
    """Killed between creating the MLflow run and recording its id: the next process continues it."""
    run_dir, _ = prepare(cfg, [])
    segment(cfg, run_dir, range(1, 4), commit=3, code=75)
    (run_dir / "mlflow" / "run.json").unlink()
    segment(cfg, run_dir, range(4, 7), commit=6, code=0, resumed_from=3)
    client, runs = read_back(cfg, run_dir)
    assert len(runs) == 1 and mlflow_store.steps(client, runs[0].info.run_id) == list(range(1, 7))


def test_benchmark_scores_reach_mlflow_at_their_checkpoints_step_once_across_processes(cfg):
    from resilient_slurm.rundir.benchmarks import append_scores

    run_dir, _ = prepare(cfg, [])
    # Scores of step 5 arrive while the first process runs steps 6..10; those of step 10 between processes.
    append_scores(run_dir / "benchmarks.jsonl", 5, {"tiny_mmlu/acc": 0.25}, attempt=1)
    segment(cfg, run_dir, range(1, 11), commit=10, code=75)
    append_scores(run_dir / "benchmarks.jsonl", 10, {"tiny_mmlu/acc": 0.5}, attempt=1)
    segment(cfg, run_dir, range(11, 16), commit=15, code=0, resumed_from=10)

    client, (run,) = read_back(cfg, run_dir)
    history = client.get_metric_history(run.info.run_id, "bench/tiny_mmlu/acc")
    assert sorted((m.step, m.value) for m in history) == [(5, 0.25), (10, 0.5)]  # each once, at its checkpoint
    assert not client.get_metric_history(run.info.run_id, "bench/step")
