"""The run directory `<root>/<experiment>/<run>/`: created on the first launch, checked on every later one.

    config.yaml      the resolved config the run uses (rewritten when only placement keys change)
    overrides.yaml   the command-line overrides of the first launch
    run.json         run id, creation time, config hash
    checkpoints/  logs/  events.jsonl  metrics.jsonl

A relaunch may change where and how the run executes (cluster, checkpoint policy, logging), but
not what it computes: a different model, data, optimizer or schedule is a different run.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from datetime import date
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from resilient_slurm.config import Config, ConfigError, flatten, to_config, to_dict
from resilient_slurm.events import utc_now
from resilient_slurm.naming import run_name

CONFIG = "config.yaml"
RUN_META = "run.json"
# Keys that may differ between launches of the same run: placement, saving and logging.
MUTABLE_PREFIXES = ("run.", "cluster.", "checkpoint.", "monitor.", "health.", "fault.", "train.log_every_steps", "train.threads")


def run_dir_for(cfg: Config, overrides: list[str], today: date | None = None) -> Path:
    name = cfg.run.name or run_name(cfg, overrides, today or date.today())
    return Path(cfg.run.root) / cfg.run.experiment / name


def identity(cfg: Config) -> dict[str, Any]:
    """The keys that define what the run computes."""
    return {k: v for k, v in flatten(to_dict(cfg)).items() if not k.startswith(MUTABLE_PREFIXES)}


def config_hash(cfg: Config) -> str:
    canonical = json.dumps(identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))


_MISSING = object()


def prepare(cfg: Config, overrides: list[str], today: date | None = None) -> tuple[Path, bool]:
    """Create or re-open the run directory; returns (path, resumed). Refuses a changed identity."""
    run_dir = run_dir_for(cfg, overrides, today)
    if cfg.run.name is None:
        cfg.run.name = run_dir.name
    existing = run_dir / CONFIG
    if existing.exists():
        saved = load_config(run_dir)
        changed = changed_keys(identity(saved), identity(cfg))
        if changed:
            listed = ", ".join(f"{k} ({flatten(to_dict(saved)).get(k)!r} -> {flatten(to_dict(cfg)).get(k)!r})"
                               for k in changed[:5])
            raise ConfigError(
                f"run {run_dir} was started with a different config: {listed}; "
                f"resume with the original values or choose a new run.name"
            )
        _write_config(run_dir, cfg)
        return run_dir, True
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    _write_config(run_dir, cfg)
    (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    meta = {"run_id": uuid.uuid4().hex[:12], "created": utc_now(), "config_hash": config_hash(cfg)}
    (run_dir / RUN_META).write_text(json.dumps(meta, indent=1) + "\n")
    return run_dir, False


def _write_config(run_dir: Path, cfg: Config) -> None:
    tmp = run_dir / f".{CONFIG}.tmp"
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    os.replace(tmp, run_dir / CONFIG)


def load_config(run_dir: Path) -> Config:
    path = run_dir / CONFIG
    if not path.exists():
        raise ConfigError(f"{path}: no such file; launch the run with python -m resilient_slurm.launch first")
    loaded = OmegaConf.load(path)
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: not a mapping; restore the run's config.yaml")
    return to_config(loaded)


def read_identity(run_dir: Path) -> dict[str, str]:
    """run_id and config_hash, stamped into every checkpoint's train_state.json."""
    meta = json.loads((run_dir / RUN_META).read_text())
    return {"run_id": meta["run_id"], "config_hash": meta["config_hash"]}
