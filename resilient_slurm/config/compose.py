"""From Hydra's composed DictConfig to the typed `Config`, once, at the entry point: types checked,
defaults the user did not choose fitted to the ones they did, every problem reported at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from resilient_slurm.config.checks import ConfigError, flatten, not_a_key
from resilient_slurm.config.model import ModelConfig
from resilient_slurm.config.overrides import Schema, unknown_keys
from resilient_slurm.config.schema import Config, budget, train_steps, validate


def register_schema() -> None:
    """Store the dataclass defaults as Hydra's config `schema`, the first entry of conf/config.yaml's
    defaults list: every key exists (so `key=value` overrides need no `+`) with its one default.
    Stored untyped, so a wrongly typed value reaches `to_config` and gets its one-line error."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=to_dict(Config()))


@dataclass(frozen=True)
class Adjustment:
    """A value the user did not choose, changed to fit the values the user did choose."""

    key: str
    old: Any
    new: Any
    why: str

    def __str__(self) -> str:
        return f"{self.key}: {self.old} -> {self.new}: {self.why}"


def to_config(cfg: DictConfig | dict[str, Any], explicit: Iterable[str] = (),
              adjustments: list[Adjustment] | None = None,
              resolve_model: Callable[[ModelConfig], ModelConfig] | None = None,
              data_location: bool = True) -> Config:
    """Resolve, type-check and validate a composed config; raise ConfigError listing every problem,
    one line each. `explicit` names the keys the user set on the command line: defaults that do not
    fit are adjusted only where the user did not choose them, and each change is appended to
    `adjustments`. `resolve_model` fills in what the model's own files say (its dimensions, from a
    pretrained directory) before the values are checked against each other. `data_location=False`:
    the data's location is not asked for (a plan reads no data)."""
    container = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    container = with_user_keys({str(k): v for k, v in container.items() if k != "hydra"})
    schema = Schema.of(Config())
    unknown = unknown_keys(container, schema)
    problems = [not_a_key(key, schema.keys) for key in unknown]
    container = _without(container, unknown)
    merged = None
    while merged is None:
        try:
            merged = OmegaConf.merge(OmegaConf.structured(Config), container)
        except OmegaConfBaseException as e:
            # Each failed merge names one bad value: note it, and go on without it for the other checks
            # (one merge per bad value; merging key by key instead copies the whole config ~200 times).
            key = getattr(e, "full_key", None)
            if key and key in flatten(container):
                problems.append(_type_problem(key, e))
                container = _without(container, [key])
                continue
            merged, bad = _merge_key_by_key(container)
            problems += bad
    try:
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(_type_problem(getattr(e, "full_key", None) or "config", e)) from None
    assert isinstance(typed, Config)
    if resolve_model is not None and not problems:
        try:
            typed.model = resolve_model(typed.model)
        except ValueError as e:
            raise ConfigError(f"model.pretrained: {e}") from None
    adjusted = fit_warmup(typed, set(explicit))
    if adjusted and adjustments is not None:
        adjustments.append(adjusted)
    problems += validate(typed, data_location)
    if problems:
        raise ConfigError("\n".join(problems))
    return typed


def with_user_keys(container: dict[str, Any]) -> dict[str, Any]:
    """A run of a user's own function (`entry=`) keeps the user's top-level keys, which the schema
    does not know, under `user`; without an entry they stay where they are, to be refused."""
    if not container.get("entry"):
        return container
    known = {f.name for f in fields(Config)}
    theirs = {k: v for k, v in container.items() if k not in known}
    ours = {k: v for k, v in container.items() if k in known}
    return {**ours, "user": {**(ours.get("user") or {}), **theirs}}


def fit_warmup(cfg: Config, explicit: set[str]) -> Adjustment | None:
    """A warmup the user did not choose that does not fit a short run (a smoke run of a recipe with
    `train.max_steps=20`) is cut to a tenth of the run. A warmup set on the command line is the
    user's: validation still refuses it if it does not fit."""
    o, steps = cfg.optim, train_steps(cfg)
    if "optim.warmup_steps" in explicit or steps < 1 or o.warmup_steps < steps:
        return None
    old = o.warmup_steps
    o.warmup_steps = steps // 10
    return Adjustment("optim.warmup_steps", old, o.warmup_steps,
                      f"the preset's warmup does not fit {budget(cfg.train, steps)}; set optim.warmup_steps "
                      f"to choose another")


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """The config keys a list of Hydra overrides sets (`optim.lr=1e-4`, `+run.name=x`, `~key`)."""
    return {item.lstrip("+~").partition("=")[0] for item in overrides if "=" in item}


def _merge_key_by_key(container: dict[str, Any]) -> tuple[Any, list[str]]:
    """The slow way, for an error that names no key (a section given a plain value): merge each
    value alone, keeping the ones that fit."""
    merged, problems = OmegaConf.structured(Config), []
    for key, value in flatten(container).items():
        try:
            merged = OmegaConf.merge(merged, _nested(key, value))
        except OmegaConfBaseException as e:
            problems.append(_type_problem(key, e))
    return merged, problems


def _without(tree: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """A copy of a nested dict with the given flattened keys left out."""
    out = dict(tree)
    for key in keys:
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            inner = dict(node[part])
            node[part] = inner
            node = inner
        node.pop(parts[-1], None)
    return out


def _nested(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _type_problem(key: str, e: Exception) -> str:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{key}: {first}; fix the value or remove the key"


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of a typed config (what config.yaml holds)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
