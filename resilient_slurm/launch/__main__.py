"""`python -m resilient_slurm.launch +experiment=NAME [key=value ...]`: compose, validate, run.

Everything a user can get wrong is checked before anything heavy is imported, each mistake one
line and exit status 2: the command line (`command`), the overrides against the schema and conf/
(`config.composer`), the composed config (`config.to_config`), the run directory (`prepare`: its
root writable, a changed config of a run that has trained) and, for `cluster=slurm`, an sbatch.
`--help` reads the docs from the source and imports nothing of the project's config. `--plan`
prints what the run would hold and move (launch/plan_report.py) and starts nothing. A finished
run is not run again. Then the run executes here (`cluster=local`: the local launcher, whose ranks
import torch) or is submitted to Slurm (`cluster=slurm`), one run per point of a `-m` sweep.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from resilient_slurm.process.threads import yield_when_idle

yield_when_idle(os.environ)  # before any rank imports torch: OpenMP reads it when it loads

from resilient_slurm.exit_codes import ExitCode  # noqa: E402
from resilient_slurm.launch import command  # noqa: E402

if TYPE_CHECKING:
    from resilient_slurm.config import Adjustment, Config, ModelConfig


@dataclass(frozen=True)
class Plan:
    """One run to launch: its checked config, the overrides that made it, the defaults fitted to them."""

    cfg: Config
    overrides: list[str]
    adjustments: list[Adjustment]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # before the run started: its launcher handles Ctrl-C itself
        print("resilient_slurm: interrupted before anything ran", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _main(argv: list[str]) -> int:
    try:
        cmd = command.parse(argv)
        for directory in cmd.config_dirs:
            if not directory.is_dir():
                raise command.UsageError(f"--config-dir {directory}: no such directory; give the directory that "
                                         f"holds your config groups")
    except command.UsageError as e:
        return _refuse("error", str(e))
    if cmd.help is not None:
        return _help(cmd.help)
    if cmd.bare:
        from resilient_slurm.launch.help import experiments

        return _refuse("error", f"no experiment; choose one with +experiment=NAME: {', '.join(experiments())} "
                                f"(--help lists them with the keys)")
    from resilient_slurm.config import ConfigError

    try:
        plans = [_plan(point, cmd.config_dirs, planning=cmd.plan) for point in _points(cmd)]
    except ConfigError as e:
        return _refuse("config error", str(e))
    if cmd.plan:
        return _print_plans(plans)
    codes = [_execute(p) for p in plans]
    # In a sweep (-m), one point's status does not stop the others; the first that failed is the command's.
    return next((c for c in codes if c != ExitCode.DONE), ExitCode.DONE)


def _points(cmd: command.Command) -> list[list[str]]:
    if not cmd.multirun:
        return [list(cmd.overrides)]
    from resilient_slurm.config.composer import sweep_points

    return sweep_points(list(cmd.overrides))


def _plan(overrides: list[str], config_dirs: tuple[Path, ...], planning: bool = False) -> Plan:
    """The overrides checked, composed, typed and validated; ConfigError with every problem
    (`planning`, for --plan: neither where the data lives, nor the optional packages, nor sbatch
    are asked for)."""
    from resilient_slurm.config import ConfigError, explicit_keys, to_config
    from resilient_slurm.config.composer import check_overrides, compose

    check_overrides(overrides, config_dirs)
    adjustments: list[Adjustment] = []
    cfg = to_config(compose(overrides, config_dirs), explicit_keys(overrides), adjustments, resolve_model=_pretrained,
                    data_location=not planning)
    if planning:  # nothing runs or is submitted: what a run needs installed is not asked for
        return Plan(cfg, overrides, adjustments)
    from resilient_slurm.launch.extras import extra_problems

    if missing := extra_problems(cfg):
        raise ConfigError("\n".join(missing))
    if cfg.cluster.kind == "slurm" and cfg.cluster.submit and shutil.which("sbatch") is None:
        raise ConfigError("cluster=slurm: no sbatch on PATH, so no Slurm to submit to here; run on a Slurm login "
                          "node, or use cluster=local")
    return Plan(cfg, overrides, adjustments)


def _print_plans(plans: list[Plan]) -> int:
    from resilient_slurm.config import layout
    from resilient_slurm.launch.plan_report import render

    for p in plans:
        laid_out = layout(p.cfg)
        assert not isinstance(laid_out, str)  # validated
        print(render(p.cfg, laid_out), end="")
    return ExitCode.DONE


def _pretrained(model: ModelConfig) -> ModelConfig:
    """A pretrained model's dimensions from its config.json. The directory is checked first: the
    reader lives with the weights' code, which imports torch."""
    if not (model.pretrained or model.config):
        return model
    if model.pretrained and not os.path.isdir(model.pretrained):
        raise ValueError(f"{model.pretrained}: no such directory; point model.pretrained at a Hugging Face model "
                         f"directory (config.json, safetensors weights, tokenizer files)")
    from resilient_slurm.model.pretrained import apply_pretrained

    return apply_pretrained(model)


def _execute(plan: Plan) -> int:
    from resilient_slurm.config import ConfigError
    from resilient_slurm.launch.prepare import finished, prepare
    from resilient_slurm.ledger import ConfigAdjusted, EventLog
    from resilient_slurm.rundir import RunDir

    cfg, overrides = plan.cfg, plan.overrides
    # Inside a job (sbatch/train.sbatch: cluster.submit=false) the last line printed must be the
    # run directory, which the script hands to its tasks: no finished check there.
    in_job = cfg.cluster.kind == "slurm" and not cfg.cluster.submit
    done = None if in_job else finished(cfg, overrides)
    if done is not None:
        print(f"resilient_slurm: run {done} already finished; nothing to do (choose a new run.name, or add "
              f"run.fork=true with a changed config, to train again)")
        return ExitCode.DONE
    try:
        run_dir, resumed = prepare(cfg, overrides)
    except ConfigError as e:
        return _refuse("config error", str(e))
    for a in plan.adjustments:
        print(f"resilient_slurm: {a}", file=sys.stderr)
        EventLog(RunDir(run_dir).events, rank=-1).emit(ConfigAdjusted(key=a.key, old=a.old, new=a.new, why=a.why),
                                                          None)
    if cfg.cluster.kind == "slurm":
        return _submit(cfg, run_dir, resumed)
    print(f"resilient_slurm: {'resuming' if resumed else 'starting'} run {run_dir}", flush=True)
    from resilient_slurm.supervise.local import run_local

    return run_local(cfg, run_dir)


def _submit(cfg: Config, run_dir: Path, resumed: bool) -> int:
    if not cfg.cluster.submit:
        print(run_dir)
        return ExitCode.DONE
    from resilient_slurm.launch.submit import SubmitError, submit

    try:
        submit(cfg, run_dir)
    except SubmitError as e:
        if not resumed:  # nothing of this run exists but what this launch just made
            shutil.rmtree(run_dir, ignore_errors=True)
            _remove_if_empty(run_dir.parent)
        return _refuse("error", str(e))
    return ExitCode.DONE


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _help(topic: str) -> int:
    from resilient_slurm.launch import help

    if not topic:
        print(help.overview(), end="")
        return ExitCode.DONE
    text = help.topic(topic)
    if text is None:
        return _refuse("error", help.unknown_topic(topic))
    print(text, end="")
    return ExitCode.DONE


def _refuse(what: str, message: str) -> int:
    for line in message.splitlines():
        print(f"resilient_slurm: {what}: {line}", file=sys.stderr)
    return ExitCode.CONFIG


if __name__ == "__main__":
    sys.exit(main())
