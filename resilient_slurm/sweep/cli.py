"""`python -m resilient_slurm.sweep +experiment=NAME sweep=grid|random|optuna|asha|pbt sweep.trials=N
sweep.parallel=P 'KEY=SPACE' ...`: compose and check everything, then run (or submit) the controller.

Arguments whose value is a search space in Hydra's grammar (`choice`, `range`, `interval`,
`tag(log, ...)`, `a,b`) form the space; the rest compose the config exactly as `launch` does. Every
problem (a config value, an unknown key, a malformed range, a value a trial could not use) is
reported, one line each, before anything is submitted.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resilient_slurm.config import Config, ConfigError, composer, explicit_keys, flatten, to_config, to_dict
from resilient_slurm.sweep import asha, pbt, study
from resilient_slurm.sweep.space import Dimension, SpaceError, grid_points, is_search_argument, parse_space
from resilient_slurm.errors import InputError

# Columns every metrics.jsonl row has; any other metric is written on evaluation steps only.
EVERY_STEP = ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "samples_per_s", "step_seconds", "data_wait_s")
USAGE = ("usage: python -m resilient_slurm.sweep +experiment=NAME [sweep=grid|random|optuna|asha|pbt] "
         "[sweep.trials=N] [sweep.parallel=P] [key=value ...] 'KEY=SPACE' ...\n"
         "  SPACE: choice(a,b,...) | range(start,stop[,step]) | interval(low,high) | tag(log,interval(low,high))")
GUIDE = """\
A search whose trials are ordinary runs (<study>-NNN beside the others in experiments/<experiment>/):
every argument that is not a search space composes the trials' config exactly as launch does.

Search spaces, in Hydra's override grammar (quote them for the shell):
  'optim.lr=choice(1e-4,3e-4)'             the listed values (or optim.lr=1e-4,3e-4)
  'train.seed=range(1,4)'                  1, 2, 3
  'optim.weight_decay=interval(0.0,0.2)'   uniform; an integer key searches integers
  'optim.lr=tag(log,interval(1e-5,1e-3))'  log-uniform

Strategies (sweep=...):
  grid     every point, in order (sweep.trials=0 runs them all)
  random   sweep.trials random points
  optuna   TPE, with the median pruner stopping trials that fall behind (sweep.pruner=...)
  asha     trials pause at rungs (sweep.min_steps, then x sweep.reduction_factor) and resume when promoted
  pbt      a population of sweep.trials: every sweep.interval_steps the bottom sweep.quantile copies a
           top member's checkpoint and goes on with perturbed values

The objective is a column of the trials' metrics.jsonl (sweep.metric=val_loss, the default, needs
eval.every_steps). cluster=slurm makes each trial a Slurm job; sweep.controller=slurm runs the
controller itself as a small requeueable job. The same command resumes a stopped or killed study.

Examples:
  python -m resilient_slurm.sweep +experiment=tiny_sft sweep=grid 'optim.lr=choice(1e-4,3e-4)' 'train.seed=range(1,4)'
  python -m resilient_slurm.sweep +experiment=tiny_sft sweep=asha sweep.trials=27 sweep.min_steps=30 \\
      eval.every_steps=30 'optim.lr=tag(log,interval(1e-5,1e-2))'
"""


class SweepError(InputError):
    """A problem with the command; one line each."""


def parse(argv: list[str]) -> Plan | None:
    """The checked plan, or None after printing every problem (one line each)."""
    try:
        return Plan.from_argv(argv)
    except (SweepError, ConfigError, SpaceError) as e:
        error(e)
        return None


def error(e: Exception) -> None:
    for line in str(e).splitlines():
        print(f"resilient_slurm: sweep: error: {line}", file=sys.stderr)


class Plan:
    """The command, composed and checked."""

    def __init__(self, base: dict[str, Any], cfg: Config, overrides: list[str], space_args: list[str],
                 dims: list[Dimension]) -> None:
        self.base, self.cfg, self.overrides, self.space_args, self.dims = base, cfg, overrides, space_args, dims

    @classmethod
    def from_argv(cls, argv: list[str]) -> Plan:
        space_args = [a for a in argv if is_search_argument(a)]
        plain = [a for a in argv if not is_search_argument(a)]
        base = _compose(plain)
        problems: list[str] = []
        cfg: Config | None = None
        try:
            cfg = to_config(base, explicit_keys(plain))
        except ConfigError as e:
            problems += str(e).splitlines()
        try:
            # With a config that did not validate, the space is still checked against its keys.
            dims = parse_space(space_args, flatten(to_dict(cfg) if cfg else base))
        except SpaceError as e:
            problems += str(e).splitlines()
        if cfg is not None and not problems:
            problems = _check_values(base, plain, space_args, dims) + _check_search(cfg, dims)
        if problems:
            raise SweepError("\n".join(problems))
        assert cfg is not None
        return cls(base, cfg, plain, space_args, dims)

    def search(self) -> study.Search:
        return study.Search(self.cfg.run.experiment, tuple(a for a in self.overrides if not _is_sweep_key(a)),
                            tuple(self.space_args), self.cfg.sweep)

    def name(self) -> str:
        return self.cfg.sweep.name or self.search().default_name()

    def path(self) -> Path:
        return study.study_dir(self.cfg.run.root, self.cfg.run.experiment, self.name())

    def pause_steps(self) -> tuple[int, ...]:
        """The steps trials pause at (ASHA rungs, PBT generations), then train.max_steps."""
        s, max_steps = self.cfg.sweep, self.cfg.train.max_steps
        if s.scheduler == "asha":
            return asha.rungs(s.min_steps, s.reduction_factor, max_steps)
        if s.scheduler == "pbt":
            return pbt.generation_steps(s.interval_steps, max_steps)
        return (max_steps,)

    def trials(self) -> int:
        if self.cfg.sweep.sampler == "grid":
            points = len(grid_points(self.dims))
            return min(self.cfg.sweep.trials or points, points)
        return self.cfg.sweep.trials


def _is_sweep_key(arg: str) -> bool:
    key = arg.lstrip("+~").partition("=")[0]
    return key == "sweep" or key.startswith("sweep.")


def _compose(plain: list[str]) -> dict[str, Any]:
    """As `launch` composes: the overrides checked first, Hydra's errors in one line each."""
    composer.check_overrides(plain)
    return composer.compose(plain)


def _check_values(base: dict[str, Any], plain: list[str], space_args: list[str], dims: list[Dimension]) -> list[str]:
    """Each choice, and each interval's bounds, must make a valid config: found now, not per trial."""
    import copy

    problems = []
    for arg, d in zip(space_args, dims):
        for value in d.choices or ((int(d.low), int(d.high)) if d.integer else (d.low, d.high)):
            tree = copy.deepcopy(base)
            node = tree
            *parents, leaf = d.key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
            try:
                to_config(tree, explicit_keys(plain) | {d.key})
            except ConfigError as e:
                problems.append(f"{arg}: with {value!r}: {str(e).splitlines()[0]}")
    return problems


def _check_search(cfg: Config, dims: list[Dimension]) -> list[str]:
    s, e, max_steps = cfg.sweep, cfg.eval, cfg.train.max_steps
    problems = []
    if s.trials == 0 and (s.sampler != "grid" or s.scheduler == "pbt"):
        problems.append("sweep.trials: 0; set the number of trials to run (pbt: the population size; 0 means every "
                        "point for sweep=grid only)")
    if s.sampler == "grid":
        try:
            grid_points(dims)
        except SpaceError as err:
            problems.append(str(err))
    if s.metric not in EVERY_STEP and e.every_steps == 0:
        problems.append(f"sweep.metric: {s.metric} is written on evaluation steps only and eval.every_steps=0; set "
                        f"eval.every_steps=N, or sweep.metric=loss")
    if s.scheduler != "none":
        pauses = (asha.rungs(s.min_steps, s.reduction_factor, max_steps) if s.scheduler == "asha"
                  else pbt.generation_steps(s.interval_steps, max_steps))[:-1]
        what = "ASHA rungs" if s.scheduler == "asha" else "PBT generation steps"
        if not pauses:
            problems.append(f"train.max_steps: {max_steps} leaves no {what} below it; lower sweep.min_steps or "
                            f"sweep.interval_steps, or raise train.max_steps")
        elif s.metric not in EVERY_STEP and e.every_steps and any(p % e.every_steps for p in pauses):
            problems.append(f"eval.every_steps: {e.every_steps} does not divide the {what} {list(pauses)}, so "
                            f"{s.metric} would be stale where trials are compared; pick a divisor")
    if s.scheduler == "pbt" and s.trials < 2:
        problems.append(f"sweep.trials: {s.trials}; a PBT population needs 2 members or more")
    return problems


@contextmanager
def controller_lock(study_dir: Path) -> Iterator[None]:
    """One controller per study: the single writer of its journal and ledger. Released when the
    process ends, however it ends."""
    study_dir.mkdir(parents=True, exist_ok=True)
    with open(study_dir / "controller.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise SweepError(f"sweep {study_dir} already has a controller ({holder}); wait for it or stop it") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.uname().nodename} pid {os.getpid()}\n")
        f.flush()
        yield
