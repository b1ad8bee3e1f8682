"""Experiment tracking: `open_tracker` gives rank 0 the committed history of the run in wandb
(offline by default) or MLflow (`tracking.backend`), and everyone else, or any run with tracking
off, a `NullTracker`.

`metrics.jsonl` is written whatever the tracker, so no tracking server is needed to see a run.
wandb, the default, is a dependency; MLflow is an extra (`resilient-slurm[mlflow]`). Each is imported
only by its sink, and a run whose tracker cannot start trains on untracked, saying so in one line.

Modules:
    base           the Tracker protocol, the NullTracker, the Table type, the dashboard names
    history        which steps are committed (covered by a durable checkpoint) and may be sent  [pure]
    committed      the Tracker for every backend: backfill, ledger mirror, mark file; a Sink writes
    wandb_sink     wandb: one run id across restarts
    wandb_files    reading wandb's offline segment files back (for reports and tests)
    mlflow_sink    MLflow: one run across restarts, params, tags, config, git diffs, tables
    mlflow_store   where a run's MLflow data lives, read back with MLflow's client (resume, report)
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.tracking.base import NullTracker, Table, Tracker

__all__ = ["NullTracker", "Table", "Tracker", "effective_mode", "open_tracker", "package_problem"]

log = logging.getLogger("resilient_slurm")
# From most to least private; WANDB_MODE's legacy spellings mean the same as the names beside them.
_PRIVACY = ("disabled", "offline", "online")
_ALIASES = {"dryrun": "offline", "run": "online"}
# The module each backend imports, and how to install it (MLflow's client is an extra of ours).
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
_INSTALL = {"wandb": "pip install wandb", "mlflow": "pip install 'resilient-slurm[mlflow]'"}


def effective_mode(configured: str, env: str | None) -> str:
    """The more private of `tracking.mode` and WANDB_MODE: the environment can switch tracking off
    or offline, but never online (a stray WANDB_MODE=online must not upload a run). Pure."""
    wanted = _ALIASES.get((env or "").strip().lower(), (env or "").strip().lower())
    if wanted not in _PRIVACY:
        return configured
    return min(configured, wanted, key=_PRIVACY.index)


def package_problem(cfg: Config) -> str | None:
    """One config-error line when the run asks for MLflow, an extra, and it is not installed (the
    launcher refuses the run before anything is queued); None otherwise. A missing wandb, the
    default and a dependency, is no reason to refuse: the run trains untracked (`open_tracker`)."""
    backend = cfg.tracking.backend
    if backend != "mlflow" or cfg.tracking.mode == "disabled" or _installed(_PACKAGES[backend]):
        return None
    return (f"tracking.backend: {backend} is not installed; {_INSTALL[backend]}, or set tracking.backend=none "
            f"(metrics.jsonl still has every step)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
        return False


def open_tracker(cfg: Config, run_dir: Path, rank: int) -> Tracker:
    """Never raises: a tracker that cannot start is logged and replaced by the NullTracker, because
    tracking must not stop training (metrics.jsonl still has every step)."""
    backend = cfg.tracking.backend
    # WANDB_MODE is wandb's own variable; MLflow's MLFLOW_TRACKING_URI is never read (tracking.uri decides).
    mode = effective_mode(cfg.tracking.mode, os.environ.get("WANDB_MODE")) if backend == "wandb" else cfg.tracking.mode
    if rank != 0 or backend not in _PACKAGES or mode == "disabled":
        return NullTracker()
    from resilient_slurm.rundir import RunDir
    from resilient_slurm.rundir.meta import read_meta
    from resilient_slurm.tracking.committed import MARK, CommittedHistory, Sink

    sink: Sink
    on_disk: int | None
    try:
        meta = read_meta(run_dir)
        if backend == "mlflow":
            from resilient_slurm.tracking.mlflow_sink import MlflowSink

            sink, on_disk = MlflowSink.open(cfg, run_dir, meta)
        else:
            from resilient_slurm.tracking.wandb_sink import WandbSink

            sink, on_disk = WandbSink.open(cfg, run_dir, mode, meta)
        folder = RunDir(run_dir).mlflow if backend == "mlflow" else RunDir(run_dir).wandb
        return CommittedHistory(sink, run_dir, folder / MARK, on_disk)
    except Exception as e:  # noqa: BLE001 - a missing package or API key, a network failure, a broken run directory
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == _PACKAGES[backend]:
            why = f"{backend} is not installed ({_INSTALL[backend]})"
        else:
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        log.warning("%s (%s) did not start: %s; tracking is off for this attempt, metrics.jsonl has every step",
                    backend, mode, why)
        return NullTracker()
