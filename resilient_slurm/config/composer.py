"""Composing conf/ with Hydra's compose API, the one way both commands (launch, sweep) do it: the
command line's overrides checked first (`overrides.check`), conf/'s groups read from disk, and
whatever Hydra still refuses said in one line. Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from resilient_slurm.config.checks import ConfigError, flatten, suggest
from resilient_slurm.config.overrides import Groups, Schema, check, hydra_problem, parse, unknown_override
from resilient_slurm.config.schema import Config

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
"""The project's conf/: config.yaml, the groups (experiment, model, data, checkpoint, cluster, sweep)."""


@cache
def schema() -> Schema:
    return Schema.of(Config())


def groups(config_dirs: Sequence[Path] = ()) -> Groups:
    """Each group's options in conf/ and in the `--config-dir`s, and the groups config.yaml chooses."""
    options: dict[str, set[str]] = {}
    for root in (CONF_DIR, *config_dirs):
        for group in sorted(p for p in root.iterdir() if p.is_dir()):
            options.setdefault(group.name, set()).update(f.stem for f in group.glob("*.yaml"))
    return Groups({g: tuple(sorted(o)) for g, o in options.items()}, frozenset(default_choices()))


def default_choices() -> dict[str, str | None]:
    """conf/config.yaml's defaults list: group -> the option it chooses (None: `sweep: null`)."""
    import yaml

    out: dict[str, str | None] = {}
    for item in yaml.safe_load((CONF_DIR / "config.yaml").read_text()).get("defaults", []):
        if isinstance(item, dict):
            out.update({k: v for k, v in item.items() if not k.startswith("override ")})
    return out


def check_overrides(overrides: Sequence[str], config_dirs: Sequence[Path] = ()) -> None:
    """Raise ConfigError (one line per problem) for overrides Hydra would refuse or misread."""
    entry = any(o.partition("=")[0].lstrip("+") == "entry" and o.partition("=")[2] for o in overrides)
    problems = check(overrides, schema(), groups(config_dirs), entry)
    if problems:
        raise ConfigError("\n".join(problems))


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of each run of a `-m` sweep (`optim.lr=1e-4,3e-4` makes two), as Hydra's basic
    sweeper spells them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as e:
        raise ConfigError(hydra_problem(str(e), schema(), groups())) from None


def compose(overrides: Sequence[str], config_dirs: Sequence[Path] = ()) -> dict[str, Any]:
    """The composed config as a plain dict (Hydra's own `hydra` node left out)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from resilient_slurm.config.compose import register_schema

    register_schema()
    search = [f"hydra.searchpath=[{','.join(f'file://{Path(d).resolve()}' for d in config_dirs)}]"] \
        if config_dirs else []
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = hydra_compose("config", overrides=[*search, *overrides])
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_own_key_problem(str(e), overrides, config_dirs)
                          or hydra_problem(str(e), schema(), groups(config_dirs))) from None
    tree = OmegaConf.to_container(composed, resolve=False)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items() if k != "hydra"}


def _own_key_problem(message: str, overrides: Sequence[str], config_dirs: Sequence[Path]) -> str | None:
    """A misspelt key of a section of the user's own (`own.lrr=1` where `+own=default` brings
    `own.lr`): the likeliest of their keys, from the config composed without that override."""
    key = unknown_override(message)
    if key is None or key.split(".")[0] in schema().tops:
        return None
    top = key.split(".")[0]
    try:
        tree = compose([o for o in overrides if parse(o).key != key], config_dirs)
    except ConfigError:
        return None
    theirs = flatten(tree.get(top) or {}, top + ".")
    close = suggest(key, theirs)
    hint = f"did you mean {close}?" if close else f"its keys are {', '.join(sorted(theirs)[:8]) or 'none'}"
    return f"{key}: not a key of {top} ({hint}); write +{key}=VALUE to add a key of your own"
