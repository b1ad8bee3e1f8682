"""One run directory read into a `Summary`: its files (`load`) and what they add up to (`summarize`,
pure; see goodput.py for what each figure means). The report and its plot both render a Summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_slurm.rundir import RunDir
from resilient_slurm.analysis.goodput import Accounting, account
from resilient_slurm.rundir.benchmarks import read_scores
from resilient_slurm.rundir.metrics import lost_path, read_metrics
from resilient_slurm.rundir.record import read_record
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.config import train_steps
from resilient_slurm.ledger import Event, Finish, Stop, read_events
from resilient_slurm.tracking.mlflow_store import StoredRun, describe
from resilient_slurm.tracking.wandb_files import segments
from resilient_slurm.errors import InputError


class ReportError(InputError):
    """Not a run directory; the message names it and the fix."""


@dataclass(frozen=True)
class RunFiles:
    """Everything the report reads from one run directory."""

    path: Path
    meta: dict[str, Any]
    max_steps: int | None
    events: list[Event[Any]]
    kept: list[dict[str, Any]]
    lost: list[dict[str, Any]]
    record: list[dict[str, Any]]
    wandb_segments: list[str] = field(default_factory=list)
    wandb_mode: str | None = None
    mlflow: StoredRun | None = None
    """The run's MLflow run as its store holds it (None: the run never used MLflow)."""
    benchmarks: list[dict[str, Any]] = field(default_factory=list)
    """benchmarks.jsonl: the scores of evaluated checkpoints, each with its checkpoint's step."""


@dataclass(frozen=True)
class Summary:
    files: RunFiles
    acc: Accounting
    final: dict[str, Any]
    """Last values of loss, val_loss, exact_match and the step each is from."""


def load(run_dir: Path) -> RunFiles:
    if not (RunDir(run_dir).meta).is_file():
        raise ReportError(f"{run_dir}: not a run directory (no run.json); pass experiments/<experiment>/<run>")
    meta = json.loads((RunDir(run_dir).meta).read_text())
    events = read_events(RunDir(run_dir).events)
    max_steps, mode = None, None
    if (RunDir(run_dir).config).is_file():
        cfg = load_config(run_dir)
        # A user's loop gives its own length (`Session.steps(n)`); the built-in trainer's is the config's.
        max_steps, mode = (None if cfg.entry else train_steps(cfg)), cfg.tracking.mode
    ends = [e.details.total_steps for e in events if isinstance(e.details, (Finish, Stop)) and e.details.total_steps]
    max_steps = ends[-1] if ends else max_steps
    metrics = RunDir(run_dir).metrics
    return RunFiles(
        path=run_dir, meta=meta, max_steps=max_steps, events=events,
        kept=read_metrics(metrics), lost=read_metrics(lost_path(metrics)), record=read_record(run_dir),
        wandb_segments=[str(p.parent) for p in segments(RunDir(run_dir).wandb, meta["run_id"])], wandb_mode=mode,
        mlflow=describe(run_dir),
        benchmarks=read_scores(RunDir(run_dir).benchmarks),
    )


def summarize(files: RunFiles) -> Summary:
    final: dict[str, Any] = {}
    for row in files.kept:
        for key in ("loss", "val_loss", "exact_match"):
            if row.get(key) is not None:
                final[key] = (row[key], row["step"])
    return Summary(files, account(files.events, files.kept, files.lost), final)
