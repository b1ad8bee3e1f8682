"""What a run computes, as opposed to where and how it executes: its identity, the hash of it, the
keys two configs differ in, and the config a run directory holds.

A relaunch may change where and how the run executes (cluster, checkpoint policy, logging), but not
what it computes: that is a different run (launch/prepare.py decides what to do about it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from resilient_slurm.config import PLACEMENT_PREFIXES, Config, ConfigError, flatten, to_config, to_dict
from resilient_slurm.files import atomic_write
from resilient_slurm.rundir.paths import RunDir

MUTABLE_PREFIXES = PLACEMENT_PREFIXES
"""Keys that may differ between launches of the same run: placement, saving and logging."""
_MISSING = object()


def identity(cfg: Config) -> dict[str, Any]:
    """The keys that define what the run computes."""
    return {k: v for k, v in flatten(to_dict(cfg)).items() if not k.startswith(MUTABLE_PREFIXES)}


def config_hash(cfg: Config) -> str:
    canonical = json.dumps(identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))


def write_config(run_dir: Path, cfg: Config) -> None:
    atomic_write(RunDir(run_dir).config, OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def load_config(run_dir: Path) -> Config:
    path = RunDir(run_dir).config
    if not path.exists():
        raise ConfigError(f"{path}: no such file; launch the run with python -m resilient_slurm.launch first")
    loaded = OmegaConf.load(path)
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: not a mapping; restore the run's config.yaml")
    return to_config(loaded)
