"""Acceptance: a run stopped by SIGUSR1, then SIGKILLed, then finished is one wandb run (one id,
three offline segments) and one metrics file, each with every step exactly once, in order, from
the timeline that survived; `report` agrees with the ledger; a changed learning rate is refused.
Real processes, real signals, wandb offline (read back from its own files)."""

import json
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime

import pytest

from resilient_slurm.rundir.metrics import read_metrics
from resilient_slurm.analysis.report import load, summarize
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.tracking.wandb_files import history, segments
from tests.integration.runs import REPO, events, finish, interrupt, launch, run_dir

pytestmark = pytest.mark.slow

STEPS = 60
# Fewer steps than runs.SMALL's 200, a checkpoint every 10; an evaluation every 30 for the validation
# rows and the predictions table (on a few samples: greedy decoding is most of an evaluation's time).
SHORT = [f"train.max_steps={STEPS}", "checkpoint.every_steps=10", "eval.every_steps=30", "eval.task_samples=4",
         "data.val_samples=16"]


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    home = tmp_path / "wandb-home"
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.setenv("WANDB_MODE", "offline")
    # As if the launcher's parent used wandb: the run must not use (or need) a wandb-core it did not start.
    monkeypatch.setenv("WANDB_SERVICE", "not-a-service-token")
    return home


def t(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_two_interruptions_leave_one_run_with_every_step_once(tmp_path, wandb_offline):
    root = tmp_path / "runs"
    rdir = run_dir(root, "tracked")
    # Paced, so the SIGKILL at step 44 lands well before the step-50 checkpoint: steps are lost.
    paced = "fault.step_sleep_s=0.05"
    code, out = interrupt(launch(root, "tracked", *SHORT, paced), rdir, 12, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(root, "tracked", *SHORT, paced), rdir, 44, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(launch(root, "tracked", *SHORT))
    assert code == ExitCode.DONE, out

    # metrics.jsonl: the surviving timeline, every step once; the SIGKILLed steps were set aside.
    kept = read_metrics(rdir / "metrics.jsonl")
    assert [r["step"] for r in kept] == list(range(1, STEPS + 1))
    lost = read_metrics(rdir / "metrics-lost.jsonl")
    resumes = [e.step for e in events(rdir) if e.kind is Kind.RESUME]
    assert len(resumes) == 2 and lost and all(r["step"] > resumes[1] for r in lost)

    # wandb: one id, one segment per process, and across them every step once, strictly increasing,
    # with the values of the surviving timeline (a redone step carries its second computation).
    run_id = json.loads((rdir / "run.json").read_text())["run_id"]
    segs = segments(rdir / "wandb", run_id)
    assert len(segs) == 3 == len(list((rdir / "wandb").glob("offline-run-*")))
    rows = [row for seg in segs for row in history(seg)]
    steps = [row.step for row in rows]
    assert steps == list(range(1, STEPS + 1))
    assert [row.values["train/loss"] for row in rows] == pytest.approx([r["loss"] for r in kept], rel=1e-12)
    assert [row.step for row in rows if "val/loss" in row.values] == [30, 60]
    assert all("val/exact_match" in row.values for row in rows if "val/loss" in row.values)
    # The predictions table rides on the row as it is sent; a killed segment's unflushed rows come
    # back from metrics.jsonl, which has the numbers but not the table, so only the last is sure.
    assert "eval/exact_match_predictions/_type" in rows[-1].values
    # Every ledger event reached wandb exactly once, the faults and restarts included.
    mirrored = Counter()
    for row in rows:
        mirrored.update({k[len("events/"):]: v for k, v in row.values.items()
                         if k.startswith("events/") and isinstance(v, int) and k.count("/") == 1})
    assert mirrored == Counter(e.kind.value for e in events(rdir))

    # report: restarts, causes and goodput agree with the ledger and the metrics.
    summary = summarize(load(rdir))
    acc = summary.acc
    assert acc.finished and acc.steps_done == STEPS and acc.restarts == 2
    assert acc.restarts_by_cause == {"stopped (SIGUSR1)": 1, "killed": 1}
    ev = events(rdir)
    starts = [i for i, e in enumerate(ev) if e.kind is Kind.START]
    assert [a.resumed_from for a in acc.attempts] == [0] + resumes
    allocated = 0.0
    for a, (i, j) in zip(acc.attempts, zip(starts, starts[1:] + [len(ev)])):
        first, until = t(ev[i].time), t(ev[j].time) if j < len(ev) else float("inf")
        window = [t(e.time) for e in ev[i:j]] + [t(ev[i].details.process_started)]
        window += [t(r["time"]) for r in kept + lost if first <= t(r["time"]) < until]
        assert a.begin_s == pytest.approx(min(window)) and a.end_s == pytest.approx(max(window))
        allocated += max(window) - min(window)
    productive = sum(r["step_seconds"] for r in kept)
    assert acc.time.productive_s == pytest.approx(productive)
    assert acc.time.goodput == pytest.approx(productive / allocated)
    assert acc.steps_lost == max(r["step"] for r in lost) - resumes[1]
    assert acc.marks.restarts[0][0] == resumes[0] and acc.marks.faults == [(acc.attempts[1].last_step,
                                                                            "killed without a trace")]

    done = subprocess.run([sys.executable, "-m", "resilient_slurm.report", str(rdir)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "2 restarts: 1 killed, 1 stopped (SIGUSR1)" in done.stdout
    assert f"{100 * acc.time.goodput:.1f}%" in done.stdout
    assert (rdir / "report.png").stat().st_size > 10_000

    # A relaunch that changes what the run computes is refused, naming the key.
    code, out = finish(launch(root, "tracked", *SHORT, "optim.lr=3e-4"))
    assert code == ExitCode.CONFIG
    assert "optim.lr (0.001 -> 0.0003)" in out and "run.fork=true" in out
