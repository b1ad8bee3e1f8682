"""The wandb adapter against real wandb, offline and hermetic: two processes' worth of segments
make one run whose steps are each logged once, with the ledger mirrored once."""

import os
from collections import Counter

import pytest

from resilient_slurm.rundir.metrics import MetricsFile
from resilient_slurm.config import Config
from resilient_slurm.launch.prepare import prepare
from resilient_slurm.rundir.meta import read_meta
from resilient_slurm.ledger import EventLog, Finish, Resume, Save, Start, Stop, read_events
from resilient_slurm.tracking import open_tracker
from resilient_slurm.tracking.wandb_files import history, segments
from resilient_slurm.tracking.committed import CommittedHistory
from resilient_slurm.tracking.wandb_sink import WandbSink


@pytest.fixture
def offline(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    yield
    import wandb

    # Stop this process's wandb-core and drop WANDB_SERVICE, which later subprocesses would inherit.
    wandb.teardown()


def segment(cfg, run_dir, steps, commit, code, resumed_from=None):
    """One process of the run: what job.py does with the tracker, without the training."""
    ledger = EventLog(run_dir / "events.jsonl")
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    tracker = open_tracker(cfg, run_dir, 0)
    assert isinstance(tracker, CommittedHistory) and isinstance(tracker.sink, WandbSink)
    ledger.emit(Start(world_size=1, pid=os.getpid(), host="here"), 0)
    if resumed_from is not None:
        metrics.truncate_after(resumed_from)
        ledger.emit(Resume(checkpoint=f"step_{resumed_from}", has_optimizer=True, source="hot", saved_world_size=1),
                    resumed_from)
    for step in steps:
        row = {"step": step, "loss": 1.0 / step + (resumed_from or 0)}
        metrics.append(row)
        tracker.log(step, row)
        if step == commit:
            ledger.emit(Save(reason="periodic", mode="sync", path=f"step_{step}", bytes=1, seconds=0.1, blocking_s=0.1,
                             has_optimizer=True), step)
            tracker.commit(step)
    ledger.emit(Stop(reason="SIGUSR1", checkpoint=None) if code else Finish(tokens_seen=len(steps)), steps[-1])
    tracker.close(code)


def test_two_segments_make_one_run_with_each_step_once(tmp_path, offline):
    cfg = Config()
    cfg.run.root, cfg.run.experiment, cfg.run.name = str(tmp_path / "runs"), "exp", "r"
    run_dir, _ = prepare(cfg, [])
    segment(cfg, run_dir, range(1, 11), commit=5, code=75)
    # The next process resumes from an older checkpoint (3): steps 4 and 5 are already in wandb,
    # so only 6.. is sent; their recomputed values stay out of the run.
    segment(cfg, run_dir, range(4, 13), commit=12, code=0, resumed_from=3)

    run_id = read_meta(run_dir)["run_id"]
    segs = segments(run_dir / "wandb", run_id)
    assert len(segs) == 2
    rows = [row for seg in segs for row in history(seg)]
    assert [r.step for r in rows] == list(range(1, 13))
    assert [r.values["train/loss"] for r in rows[:5]] == pytest.approx([1.0 / s for s in range(1, 6)])
    assert [r.values["train/loss"] for r in rows[5:]] == pytest.approx([1.0 / s + 3 for s in range(6, 13)])
    mirrored = Counter()
    for r in rows:
        mirrored.update({k[7:]: v for k, v in r.values.items() if k.startswith("events/") and k.count("/") == 1})
    assert mirrored == Counter(e.kind.value for e in read_events(run_dir / "events.jsonl"))
    assert rows[4].values["events/stop"] == 1  # seen at close, merged into the last row sent


def test_benchmark_scores_reach_wandb_at_their_checkpoints_step_once_across_segments(tmp_path, offline):
    from resilient_slurm.rundir.benchmarks import append_scores

    cfg = Config()
    cfg.run.root, cfg.run.experiment, cfg.run.name = str(tmp_path / "runs"), "exp", "b"
    run_dir, _ = prepare(cfg, [])
    # Scores of step 5 arrive while the first segment runs steps 6..10; those of step 10 between segments.
    append_scores(run_dir / "benchmarks.jsonl", 5, {"tiny_mmlu/acc": 0.25}, attempt=1)
    segment(cfg, run_dir, range(1, 11), commit=10, code=75)
    append_scores(run_dir / "benchmarks.jsonl", 10, {"tiny_mmlu/acc": 0.5}, attempt=1)
    segment(cfg, run_dir, range(11, 16), commit=15, code=0, resumed_from=10)

    rows = [row for seg in segments(run_dir / "wandb", read_meta(run_dir)["run_id"]) for row in history(seg)]
    bench = [(r.step, r.values["bench/step"], r.values["bench/tiny_mmlu/acc"]) for r in rows if "bench/step" in r.values]
    assert [(x, y) for _, x, y in bench] == [(5, 0.25), (10, 0.5)]  # each once, at its checkpoint's step
    assert all(wandb_step > bench_step for wandb_step, bench_step, _ in bench)  # sent after training passed it
