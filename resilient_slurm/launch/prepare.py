"""The run directory of a launch: created on the first launch, checked on every later one.

The directory's files are `rundir.RunDir`'s. A relaunch may change where and how the run executes
(cluster, checkpoint policy, logging), but not what it computes (`rundir.identity`): a different
model, data, optimizer or schedule is a different run, refused unless `run.fork=true` asks for one
(`<name>-forkN`, whose run.json names its parent).

The config is frozen only once the run has trained: before its first checkpoint (no `save` in its
ledger) a relaunch may change anything, data included (its recorded fingerprint is dropped). The
other exception is a change the caller allows explicitly (`AllowedChange`: PBT's explore step
continues a member with new hyperparameters). Either is recorded in run.json (`changes`, and the new
config hash) and in the ledger (`config_changed`); the run resumes with the new values.

A run that has finished (a `finish` in its ledger) is not run again: `finished` finds it first.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from resilient_slurm.config import Config, ConfigError, flatten, to_dict
from resilient_slurm.files import atomic_write, utc_stamp
from resilient_slurm.launch.naming import ablation_group, digested, run_name
from resilient_slurm.ledger import ConfigChanged, EventLog, Kind, read_events
from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.identity import changed_keys, config_hash, identity, load_config, write_config
from resilient_slurm.rundir.meta import read_meta, update_meta, write_meta
from resilient_slurm.rundir.record import record_launch

_LISTED_KEYS = 5


def run_dir_for(cfg: Config, overrides: list[str], today: date | None = None) -> Path:
    name = cfg.run.name or run_name(cfg, overrides, today or date.today())
    return Path(cfg.run.root) / cfg.run.experiment / name


@dataclass(frozen=True)
class AllowedChange:
    """Identity keys a relaunch may change, and why (recorded with the change)."""

    keys: frozenset[str]
    reason: str


def prepare(cfg: Config, overrides: list[str], today: date | None = None,
            allow: AllowedChange | None = None) -> tuple[Path, bool]:
    """Create or re-open the run directory; returns (path, resumed). Refuses a changed identity,
    or with `run.fork` moves to the first fork `<name>-forkN` that is new or has this identity;
    a change of only the keys `allow` names is made and recorded instead."""
    run_dir = run_dir_for(cfg, overrides, today)
    _check_writable(Path(cfg.run.root))
    parent: dict[str, Any] | None = None
    if cfg.run.fork and RunDir(run_dir).exists() and trained(run_dir) and (changed := _changed(run_dir, cfg)):
        parent = {"name": run_dir.name, "run_id": read_meta(run_dir)["run_id"], "changed": changed}
        run_dir = _fork_dir(run_dir, cfg)
    cfg.run.name = run_dir.name
    if RunDir(run_dir).exists():
        changed = _changed(run_dir, cfg)
        allow = allow or long_run_change(load_config(run_dir), cfg)
        if not trained(run_dir):
            RunDir(run_dir).data_record.unlink(missing_ok=True)
            if changed:
                _record_change(run_dir, cfg, changed, "not trained yet (no checkpoint): a relaunch may change anything")
        elif changed and allow is not None and set(changed) <= allow.keys:
            _record_change(run_dir, cfg, changed, allow.reason)
        elif changed:
            old, new = flatten(to_dict(load_config(run_dir))), flatten(to_dict(cfg))
            listed = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in changed[:_LISTED_KEYS])
            more = f" and {len(changed) - _LISTED_KEYS} more" if len(changed) > _LISTED_KEYS else ""
            raise ConfigError(
                f"run {run_dir} was started with a different config: {listed}{more}; "
                f"resume with the original values, choose a new run.name, or add run.fork=true"
            )
        write_config(run_dir, cfg)
        record_launch(run_dir, overrides, resumed=True)
        return run_dir, True
    ablation = _ablation(cfg)
    paths = RunDir(run_dir)
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(exist_ok=True)
    write_config(run_dir, cfg)
    atomic_write(paths.overrides, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    meta: dict[str, Any] = {
        "run_id": uuid.uuid4().hex[:12], "name": run_dir.name, "experiment": cfg.run.experiment,
        "created": utc_stamp(), "config_hash": config_hash(cfg),
    }
    # The values the name spells as digests (`sources-3f9c21`), whole.
    if short := {part: o for part, o in digested(overrides).items() if part in run_dir.name}:
        meta["name_digests"] = short
    if parent:
        meta["parent"] = parent
    if ablation:
        meta["ablation"] = ablation
    write_meta(run_dir, meta)
    record_launch(run_dir, overrides, resumed=False)
    return run_dir, False


def trained(run_dir: Path) -> bool:
    """The run has saved a checkpoint (in whichever tier): from then on what it computes is fixed."""
    return any(e.kind is Kind.SAVE for e in read_events(RunDir(run_dir).events))


def finished(cfg: Config, overrides: list[str], today: date | None = None) -> Path | None:
    """The run directory this launch would re-open, if that run has finished with this same config
    (a changed one is for `prepare` to refuse or fork)."""
    run_dir = run_dir_for(cfg, overrides, today)
    if not RunDir(run_dir).exists() or _changed(run_dir, cfg):
        return None
    return run_dir if any(e.kind is Kind.FINISH for e in read_events(RunDir(run_dir).events)) else None


def _check_writable(root: Path) -> None:
    """The experiments root exists (or is made) and takes a new file; else one line naming it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as e:
        raise ConfigError(f"run.root: cannot write to {root} ({e.strerror or e}); set run.root to a directory you "
                          f"can write") from None


LENGTH_KEYS = frozenset({"train.max_steps", "train.max_tokens", "optim.decay_steps", "optim.decay_fraction",
                         "optim.decay_shape"})
"""A warmup-stable-decay run may be extended, or its decay begun, from any checkpoint."""
PHASE_KEYS = LENGTH_KEYS | {"data.phase", "data.sources", "data.on_exhausted"}
"""A new data phase of a token mixture may change its sources and weights, and the run's length with them."""


def long_run_change(old: Config, new: Config) -> AllowedChange | None:
    """What a long run may change when it is launched again, recorded as it is made: a token mixture
    with another `data.phase` begins that phase at the step it resumes from (the trainer records it);
    a WSD schedule may be extended or annealed (its stable phase lasts until the new decay)."""
    if new.data.kind == "tokens" and new.data.phase != old.data.phase:
        return AllowedChange(PHASE_KEYS, f"data phase {new.data.phase!r} begins (it was {old.data.phase!r})")
    if new.optim.schedule == "wsd" == old.optim.schedule:
        return AllowedChange(LENGTH_KEYS, "the warmup-stable-decay schedule extended or annealed")
    return None


def _record_change(run_dir: Path, cfg: Config, changed: list[str], reason: str) -> None:
    """run.json gets the change and the new config hash (stamped into the checkpoints saved from now
    on, which is how the loop knows to apply the new values when it resumes from an older one)."""
    old, new = flatten(to_dict(load_config(run_dir))), flatten(to_dict(cfg))
    diff = {k: [old.get(k), new.get(k)] for k in changed}

    def record(meta: dict[str, Any]) -> None:
        meta.setdefault("changes", []).append({"time": utc_stamp(), "changed": diff, "reason": reason,
                                               "previous_config_hash": meta["config_hash"]})
        meta["config_hash"] = config_hash(cfg)

    update_meta(run_dir, record)
    EventLog(RunDir(run_dir).events, rank=-1).emit(ConfigChanged(changed=diff, reason=reason), None)


def _changed(run_dir: Path, cfg: Config) -> list[str]:
    return changed_keys(identity(load_config(run_dir)), identity(cfg))


def _fork_dir(parent: Path, cfg: Config) -> Path:
    """The first `<parent>-forkN` that does not exist yet or was started with this same config."""
    n = 1
    while RunDir(candidate := parent.with_name(f"{parent.name}-fork{n}")).exists():
        if not _changed(candidate, cfg):
            return candidate
        n += 1
    return candidate


def _ablation(cfg: Config) -> dict[str, Any] | None:
    """The group of an ablation run, from the identity keys that differ from its baseline's."""
    if cfg.run.baseline is None:
        return None
    baseline_dir = Path(cfg.run.root) / cfg.run.experiment / cfg.run.baseline
    if not RunDir(baseline_dir).exists():
        raise ConfigError(f"run.baseline: no run {baseline_dir}; launch the baseline first or fix the name")
    base, mine = identity(load_config(baseline_dir)), identity(cfg)
    changed = changed_keys(base, mine)
    diff = {k: (base.get(k), mine.get(k)) for k in changed}
    assert cfg.run.name is not None
    return {"baseline": cfg.run.baseline, "group": ablation_group(diff, cfg.run.baseline, cfg.run.name),
            "changed": changed}


