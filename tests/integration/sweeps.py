"""Running `python -m resilient_slurm.sweep` from tests, and reading a study back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna

from resilient_slurm.ledger import read_events
from tests.integration.runs import REPO, SMALL

# Trials of a few seconds: 40 steps of the SMALL model, evaluated every 10 (no decoding).
TRIAL = [*SMALL, "train.max_steps=40", "eval.every_steps=10", "eval.task_samples=0", "data.val_samples=16",
         "checkpoint.every_steps=10", "train.threads=1", "sweep.poll_s=0.2"]


def sweep_argv(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "resilient_slurm.sweep", *TRIAL, f"run.root={root}", *args]


def start(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(sweep_argv(root, *args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def run(root: Path, *args: str, timeout: float = 180) -> str:
    done = subprocess.run(sweep_argv(root, *args), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def study_dir(root: Path) -> Path:
    (path,) = (root / "tiny_sft" / "sweeps").iterdir()
    return path


def load(path: Path) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name=path.name, storage=JournalStorage(JournalFileBackend(str(path / "optuna.journal"))))


def study_events(path: Path):
    return read_events(path / "events.jsonl")


def reports_per_step(path: Path) -> Counter:
    """How often the journal recorded an intermediate value for each (trial id, step)."""
    set_intermediate = 7  # optuna.storages.journal JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE
    ops = [json.loads(line) for line in (path / "optuna.journal").read_text().splitlines()]
    return Counter((op["trial_id"], op["step"]) for op in ops if op["op_code"] == set_intermediate)
