"""The launch command line: Hydra's few options we take, and the overrides. Pure.

`launch` composes with Hydra's compose API instead of `@hydra.main`, so that it can check the
overrides first and say what is wrong in one line, and answer `--help` without importing anything
heavy. The options kept are the ones the project uses: `-m`/`--multirun` (one run per point of
the sweeps in the overrides), `--config-dir DIR` (a user's own config groups), `-h`/`--help
[SECTION|KEY]`. Any other option is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resilient_slurm.errors import InputError


class UsageError(InputError):
    """The command line itself is wrong; one line naming the argument and the fix."""


@dataclass(frozen=True)
class Command:
    overrides: tuple[str, ...]
    multirun: bool = False
    config_dirs: tuple[Path, ...] = ()
    help: str | None = None
    """None: run; "": the overview; else a section or key to describe."""
    plan: bool = False
    """Print the run's plan (layout, memory per GPU, batch, checkpoint bytes, collectives) instead of
    running it."""

    @property
    def bare(self) -> bool:
        """Nothing says what to train: no experiment and no function of the user's own."""
        keys = {o.lstrip("+").partition("=")[0] for o in self.overrides}
        return not keys & {"experiment", "entry"}


_HELP = ("-h", "--help")
_MULTIRUN = ("-m", "--multirun")
_CONFIG_DIR = ("-cd", "--config-dir")
_PLAN = "--plan"


def parse(argv: list[str]) -> Command:
    overrides: list[str] = []
    multirun = False
    config_dirs: list[Path] = []
    help_topic: str | None = None
    plan = False
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg in _HELP:  # the rest of the line does not matter then
            nxt = next(args, None)
            help_topic = nxt if nxt is not None and not nxt.startswith("-") and "=" not in nxt else ""
        elif arg in _MULTIRUN:
            multirun = True
        elif arg == _PLAN:
            plan = True
        elif name in _CONFIG_DIR:
            directory = value if eq else next(args, None)
            if not directory:
                raise UsageError(f"{arg}: no directory; write {name} DIR")
            config_dirs.append(Path(directory))
        elif arg.startswith("-"):
            raise UsageError(f"{arg}: not an option of launch; it takes -m, --config-dir DIR, --plan, --help and "
                             f"KEY=VALUE overrides")
        else:
            overrides.append(arg)
    return Command(tuple(overrides), multirun, tuple(config_dirs), help_topic, plan)
