"""run.json: the run's id, name, creation time and config hash; a fork's parent, an ablation's group,
and the config changes a search made. Read by everyone, updated atomically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resilient_slurm.files import atomic_write
from resilient_slurm.rundir.paths import RunDir


def read_meta(run_dir: Path) -> dict[str, Any]:
    """run.json: run_id, name, created, config_hash, and `parent` / `ablation` / `changes` where they apply."""
    return json.loads(RunDir(run_dir).meta.read_text())


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    atomic_write(RunDir(run_dir).meta, json.dumps(meta, indent=1) + "\n")


def update_meta(run_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read run.json, let `change` edit it in place, and replace the file atomically; the new content."""
    meta = read_meta(run_dir)
    change(meta)
    write_meta(run_dir, meta)
    return meta


def read_identity(run_dir: Path) -> dict[str, str]:
    """run_id and config_hash, stamped into every checkpoint's train_state.json."""
    meta = read_meta(run_dir)
    return {"run_id": meta["run_id"], "config_hash": meta["config_hash"]}
