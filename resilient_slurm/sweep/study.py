"""The study directory `<run.root>/<experiment>/sweeps/<name>/` and the Optuna study in it.

    sweep.yaml        the search the study was started with (experiment, overrides, space, settings)
    optuna.journal    Optuna's JournalStorage file: every trial, its values and states
    events.jsonl      the study's ledger: launches, pauses, promotions, prunings, PBT decisions
    leaderboard.csv   one row per trial (also printed)
    plots/            history.png, slices.png, importance.png, lineage.png (PBT)
    controller.lock   held by the running controller: one writer per study
    controller/       sweep.controller=slurm: the controller job's submitit folder and logs

Only the controller writes here. The name defaults to the search's kind and a hash of the command,
so running the same command again finds the same study and resumes it; a different search under
an existing name is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf

from resilient_slurm.config import SweepConfig
from resilient_slurm.sweep.space import Dimension
from resilient_slurm.errors import InputError

# Settings a restart may change: how fast and how wide the search runs, not what it searches.
MUTABLE_SETTINGS = ("name", "trials", "parallel", "budget_steps", "controller", "controller_time_min", "poll_s")
JOURNAL = "optuna.journal"
SPEC = "sweep.yaml"


class StudyError(InputError):
    """The study directory does not match the command; one line naming the fix."""


@dataclass(frozen=True)
class Search:
    """What a sweep command asks for: its identity decides the study's default name."""

    experiment: str
    overrides: tuple[str, ...]
    """The plain overrides, sweep settings left out (they are in `settings`)."""
    space: tuple[str, ...]
    settings: SweepConfig

    def identity(self) -> dict[str, Any]:
        fixed = {k: v for k, v in OmegaConf.to_container(OmegaConf.structured(self.settings)).items()  # type: ignore[union-attr]
                 if k not in MUTABLE_SETTINGS}
        return {"experiment": self.experiment, "overrides": sorted(self.overrides), "space": list(self.space),
                "settings": fixed}

    def label(self) -> str:
        s = self.settings
        return s.scheduler if s.scheduler != "none" else s.sampler

    def default_name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True, default=str).encode()).hexdigest()
        return f"{self.label()}-{digest[:8]}"


def study_dir(root: str, experiment: str, name: str) -> Path:
    return Path(root) / experiment / "sweeps" / name


def check_spec(path: Path, search: Search) -> bool:
    """Write sweep.yaml for a new study, or check an existing one against the command; True if
    the study existed."""
    spec = path / SPEC
    mine = search.identity()
    if spec.exists():
        loaded = OmegaConf.to_container(OmegaConf.load(spec))
        assert isinstance(loaded, dict)
        theirs = {str(k): v for k, v in loaded.items()}
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if differ:
            raise StudyError(f"sweep {path} was started with a different {', '.join(differ)}; run its original "
                             f"command to resume it, or set sweep.name to start another study")
        return True
    path.mkdir(parents=True, exist_ok=True)
    spec.write_text(OmegaConf.to_yaml(OmegaConf.create(mine)))
    return False


def open_study(path: Path, name: str, s: SweepConfig, max_steps: int) -> optuna.Study:
    """The Optuna study on the journal file, created on first use."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = str(path / JOURNAL)
    # The O_EXCL lock works on NFSv3 and later; there is one writer anyway (controller.lock).
    storage = JournalStorage(JournalFileBackend(journal, lock_obj=JournalFileOpenLock(journal)))
    direction = optuna.study.StudyDirection.MINIMIZE if s.direction == "minimize" else \
        optuna.study.StudyDirection.MAXIMIZE
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True, direction=direction,
                                pruner=_pruner(s, max_steps))
    # Seeded past the trials already asked: a restarted sampler must not draw the same points again.
    study.sampler = _sampler(s, s.seed * 1_000_003 + len(study.trials))
    return study


def _sampler(s: SweepConfig, seed: int) -> optuna.samplers.BaseSampler:
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.startup_trials)
    # grid: every point is enqueued in order (`enqueue_grid`); the sampler never draws.
    return optuna.samplers.RandomSampler(seed=seed)


def _pruner(s: SweepConfig, max_steps: int) -> optuna.pruners.BasePruner:
    if s.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=s.startup_trials, n_warmup_steps=s.prune_after_steps)
    if s.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(s.min_steps, s.prune_after_steps, 1),
                                                      reduction_factor=s.reduction_factor)
    if s.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(s.min_steps, s.prune_after_steps, 1),
                                              max_resource=max_steps, reduction_factor=s.reduction_factor)
    return optuna.pruners.NopPruner()


def distributions(dims: list[Dimension]) -> dict[str, optuna.distributions.BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for d in dims:
        if d.is_choice:
            out[d.key] = CategoricalDistribution(list(d.choices))
        elif d.integer:
            out[d.key] = IntDistribution(int(d.low), int(d.high), log=d.log)
        else:
            out[d.key] = FloatDistribution(d.low, d.high, log=d.log)
    return out


def enqueue_grid(study: optuna.Study, points: Sequence[Mapping[str, Any]]) -> None:
    """Queue every grid point once (again after a restart: points already in the study are skipped)."""
    for point in points:
        study.enqueue_trial(dict(point), skip_if_exists=True)
