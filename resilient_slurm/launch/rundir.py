"""The run directory `<root>/<experiment>/<run>/`: created on the first launch, checked on every later one.

    config.yaml      the resolved config the run uses (rewritten when only placement keys change)
    overrides.yaml   the command-line overrides of the first launch
    run.json         run id, name, creation time, config hash; the parent of a fork, the ablation group
    record.jsonl     every launch (overrides) and attempt (job, nodes, versions, git; see record.py)
    checkpoints/  logs/  events.jsonl  metrics.jsonl  wandb/  git/

A relaunch may change where and how the run executes (cluster, checkpoint policy, logging), but
not what it computes: a different model, data, optimizer or schedule is a different run, refused
unless `run.fork=true` asks for one (`<name>-forkN`, whose run.json names its parent).

The one exception is a change the caller allows explicitly (`AllowedChange`: PBT's explore step
continues a member with new hyperparameters). It is recorded in run.json (`changes`, and the new
config hash) and in the ledger (`config_changed`); the run resumes with the new values.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from resilient_slurm.analysis.record import record_launch
from resilient_slurm.config import (
    PLACEMENT_PREFIXES,
    Config,
    ConfigError,
    flatten,
    to_config,
    to_dict,
)
from resilient_slurm.launch.naming import ablation_group, run_name
from resilient_slurm.ledger import ConfigChanged, EventLog, utc_now

CONFIG = "config.yaml"
RUN_META = "run.json"
# Keys that may differ between launches of the same run: placement, saving and logging.
MUTABLE_PREFIXES = PLACEMENT_PREFIXES
_LISTED_KEYS = 5


def run_dir_for(cfg: Config, overrides: list[str], today: date | None = None) -> Path:
    name = cfg.run.name or run_name(cfg, overrides, today or date.today())
    return Path(cfg.run.root) / cfg.run.experiment / name


def identity(cfg: Config) -> dict[str, Any]:
    """The keys that define what the run computes."""
    return {k: v for k, v in flatten(to_dict(cfg)).items() if not k.startswith(MUTABLE_PREFIXES)}


def config_hash(cfg: Config) -> str:
    canonical = json.dumps(identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AllowedChange:
    """Identity keys a relaunch may change, and why (recorded with the change)."""

    keys: frozenset[str]
    reason: str


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))


_MISSING = object()


def prepare(cfg: Config, overrides: list[str], today: date | None = None,
            allow: AllowedChange | None = None) -> tuple[Path, bool]:
    """Create or re-open the run directory; returns (path, resumed). Refuses a changed identity,
    or with `run.fork` moves to the first fork `<name>-forkN` that is new or has this identity;
    a change of only the keys `allow` names is made and recorded instead."""
    run_dir = run_dir_for(cfg, overrides, today)
    parent: dict[str, Any] | None = None
    if cfg.run.fork and (run_dir / CONFIG).exists() and (changed := _changed(run_dir, cfg)):
        parent = {"name": run_dir.name, "run_id": read_meta(run_dir)["run_id"], "changed": changed}
        run_dir = _fork_dir(run_dir, cfg)
    cfg.run.name = run_dir.name
    if (run_dir / CONFIG).exists():
        changed = _changed(run_dir, cfg)
        if changed and allow is not None and set(changed) <= allow.keys:
            _record_change(run_dir, cfg, changed, allow.reason)
        elif changed:
            old, new = flatten(to_dict(load_config(run_dir))), flatten(to_dict(cfg))
            listed = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in changed[:_LISTED_KEYS])
            more = f" and {len(changed) - _LISTED_KEYS} more" if len(changed) > _LISTED_KEYS else ""
            raise ConfigError(
                f"run {run_dir} was started with a different config: {listed}{more}; "
                f"resume with the original values, choose a new run.name, or add run.fork=true"
            )
        _write_config(run_dir, cfg)
        record_launch(run_dir, overrides, resumed=True)
        return run_dir, True
    ablation = _ablation(cfg)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    _write_config(run_dir, cfg)
    (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    meta: dict[str, Any] = {
        "run_id": uuid.uuid4().hex[:12], "name": run_dir.name, "experiment": cfg.run.experiment,
        "created": utc_now(), "config_hash": config_hash(cfg),
    }
    if parent:
        meta["parent"] = parent
    if ablation:
        meta["ablation"] = ablation
    (run_dir / RUN_META).write_text(json.dumps(meta, indent=1) + "\n")
    record_launch(run_dir, overrides, resumed=False)
    return run_dir, False


def _record_change(run_dir: Path, cfg: Config, changed: list[str], reason: str) -> None:
    """run.json gets the change and the new config hash (stamped into the checkpoints saved from now
    on, which is how the loop knows to apply the new values when it resumes from an older one)."""
    old, new = flatten(to_dict(load_config(run_dir))), flatten(to_dict(cfg))
    diff = {k: [old.get(k), new.get(k)] for k in changed}
    meta = read_meta(run_dir)
    meta.setdefault("changes", []).append({"time": utc_now(), "changed": diff, "reason": reason,
                                           "previous_config_hash": meta["config_hash"]})
    meta["config_hash"] = config_hash(cfg)
    tmp = run_dir / f".{RUN_META}.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, run_dir / RUN_META)
    EventLog(run_dir / "events.jsonl", rank=-1).emit(ConfigChanged(changed=diff, reason=reason), None)


def _changed(run_dir: Path, cfg: Config) -> list[str]:
    return changed_keys(identity(load_config(run_dir)), identity(cfg))


def _fork_dir(parent: Path, cfg: Config) -> Path:
    """The first `<parent>-forkN` that does not exist yet or was started with this same config."""
    n = 1
    while (candidate := parent.with_name(f"{parent.name}-fork{n}")).joinpath(CONFIG).exists():
        if not _changed(candidate, cfg):
            return candidate
        n += 1
    return candidate


def _ablation(cfg: Config) -> dict[str, Any] | None:
    """The group of an ablation run, from the identity keys that differ from its baseline's."""
    if cfg.run.baseline is None:
        return None
    baseline_dir = Path(cfg.run.root) / cfg.run.experiment / cfg.run.baseline
    if not (baseline_dir / CONFIG).exists():
        raise ConfigError(f"run.baseline: no run {baseline_dir}; launch the baseline first or fix the name")
    base, mine = identity(load_config(baseline_dir)), identity(cfg)
    changed = changed_keys(base, mine)
    diff = {k: (base.get(k), mine.get(k)) for k in changed}
    assert cfg.run.name is not None
    return {"baseline": cfg.run.baseline, "group": ablation_group(diff, cfg.run.baseline, cfg.run.name),
            "changed": changed}


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


def read_meta(run_dir: Path) -> dict[str, Any]:
    """run.json: run_id, name, created, config_hash, and `parent` / `ablation` where they apply."""
    return json.loads((run_dir / RUN_META).read_text())


def read_identity(run_dir: Path) -> dict[str, str]:
    """run_id and config_hash, stamped into every checkpoint's train_state.json."""
    meta = read_meta(run_dir)
    return {"run_id": meta["run_id"], "config_hash": meta["config_hash"]}
