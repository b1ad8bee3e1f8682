"""Experiment tracking: `open_tracker` gives rank 0 a wandb run (offline by default) and everyone
else, or any run with tracking disabled, a `NullTracker`.

`metrics.jsonl` is written whatever the tracker, so no tracking server is needed to see a run.

Modules:
    base           the Tracker protocol, the NullTracker and the Table type
    history        which steps are committed (covered by a durable checkpoint) and may be sent  [pure]
    wandb_tracker  the wandb adapter: one run id across restarts, committed history only
    wandb_files    reading wandb's offline segment files back (for reports and tests)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.tracking.base import NullTracker, Table, Tracker

__all__ = ["NullTracker", "Table", "Tracker", "effective_mode", "open_tracker"]

log = logging.getLogger("resilient_slurm")
# From most to least private; WANDB_MODE's legacy spellings mean the same as the names beside them.
_PRIVACY = ("disabled", "offline", "online")
_ALIASES = {"dryrun": "offline", "run": "online"}


def effective_mode(configured: str, env: str | None) -> str:
    """The more private of `tracking.mode` and WANDB_MODE: the environment can switch tracking off
    or offline, but never online (a stray WANDB_MODE=online must not upload a run). Pure."""
    wanted = _ALIASES.get((env or "").strip().lower(), (env or "").strip().lower())
    if wanted not in _PRIVACY:
        return configured
    return min(configured, wanted, key=_PRIVACY.index)


def open_tracker(cfg: Config, run_dir: Path, rank: int) -> Tracker:
    """Never raises: a tracker that cannot start is logged and replaced by the NullTracker, because
    tracking must not stop training (metrics.jsonl still has every step)."""
    mode = effective_mode(cfg.tracking.mode, os.environ.get("WANDB_MODE"))
    if rank != 0 or mode == "disabled":
        return NullTracker()
    from resilient_slurm.rundir.meta import read_meta
    from resilient_slurm.tracking.wandb_tracker import WandbTracker

    try:
        return WandbTracker.open(cfg, run_dir, mode, read_meta(run_dir))
    except Exception as e:  # noqa: BLE001 - import errors, a missing API key, a network failure
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        log.warning("wandb (%s) did not start: %s: %s; tracking is off for this attempt, metrics.jsonl has every step",
                    mode, type(e).__name__, first)
        return NullTracker()
