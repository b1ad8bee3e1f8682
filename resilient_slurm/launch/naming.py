"""Run names `{model}-{task}-{date}-{variant}` (the variant spelled from the overrides) and ablation
groups `ablation-<component>-<baseline>-vs-<variant>` (spelled from the keys that differ). Pure."""

from __future__ import annotations

import hashlib
import re
from datetime import date
from pathlib import PurePath
from typing import Any

from resilient_slurm.config import PLACEMENT_PREFIXES, Config

# How an override's key is abbreviated in a variant (`optim.lr=1e-4` -> `lr1e-4`).
_ABBREVIATIONS = {
    "optim.lr": "lr",
    "data.global_batch_size": "bs",
    "data.seq_len": "seq",
    "train.seed": "seed",
    "train.max_steps": "steps",
    "optim.warmup_steps": "warmup",
    "optim.weight_decay": "wd",
    "model.num_layers": "layers",
    "model.hidden_size": "d",
    "cluster.ranks": "ranks",
    "model.lora.rank": "lora-r",
    "model.lora.alpha": "lora-alpha",
    "model.lora.dropout": "lora-dropout",
    "model.lora.targets": "targets",
}
# Suffixes left out when a list of layer names is spelled (`[q_proj,k_proj,v_proj]` -> `qkv`).
_LAYER_SUFFIXES = ("_proj",)
# Overrides of where or how a run executes, not what it computes: never part of a variant.
_PLACEMENT = PLACEMENT_PREFIXES + ("hydra.", "hydra/")
# An ablation group spells at most this many changed keys; beyond, it names the two runs instead.
_MAX_GROUP_KEYS = 3
# Group choices the name already spells (model, task) or that do not change what is computed.
_NAMED_GROUPS = ("experiment", "model", "data", "cluster", "checkpoint", "entry")
# A part of a variant longer than this is spelled as a digest of its value (the full value is in run.json).
MAX_PART = 24
# Paths the name spells by their base names, as the model and the task (or that follow from them).
_NAMED_PATHS = ("model.pretrained", "data.path", "data.tokenizer")


def variant(overrides: list[str]) -> str:
    return "-".join(part for part, _ in _parts(overrides)) or "base"


def digested(overrides: list[str]) -> dict[str, str]:
    """The parts of the variant that stand for a longer value (`sources-3f9c21`), each with the
    override it stands for: what run.json keeps beside the name."""
    return {part: item for part, item in _parts(overrides) if item is not None}


def _parts(overrides: list[str]) -> list[tuple[str, str | None]]:
    """Each part of the variant, with the override it digests when it is too long to spell (a list of
    data sources, a long path): the key's short name and a digest of the value; else None."""
    parts: list[tuple[str, str | None]] = []
    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if not sep or key.startswith(_PLACEMENT) or key in _NAMED_GROUPS or key in _NAMED_PATHS:
            continue
        if "." not in key:  # another group's choice, e.g. `lora=r16`
            part = f"{_clean(key)}-{_clean(value)}"
        elif value.startswith("[") and value.endswith("]"):
            items = [v.strip(" '\"") for v in value[1:-1].split(",")]
            part = f"{_short(key)}-{_list(items)}"
        else:
            part = f"{_short(key)}{_clean(_number(value))}"
        if len(part) > MAX_PART:
            parts.append((f"{_short(key)}-{hashlib.sha256(value.encode()).hexdigest()[:6]}", item))
        else:
            parts.append((part, None))
    return parts


def run_name(cfg: Config, overrides: list[str], today: date) -> str:
    """A user's own function (`entry=pkg.mod:fn`) is named by its package, as the model and the
    task name the built-in trainer's runs."""
    what = cfg.entry.split(".")[0].split(":")[0] if cfg.entry else f"{cfg.model.name}-{task(cfg)}"
    return f"{_clean(what)}-{today:%Y%m%d}-{variant(overrides)}"


def task(cfg: Config) -> str:
    """The data's name: `data.task` for the package's own sets (`asset:`), else the base name of
    `data.path` (`/data/support_v2.jsonl` -> `support_v2`; a directory's own name)."""
    path = cfg.data.path.rstrip("/")
    if not path or path.startswith("asset:"):
        return cfg.data.task
    return PurePath(path).name.removesuffix(".jsonl")


def ablation_group(changed: dict[str, tuple[Any, Any]], baseline_run: str, run: str) -> str:
    """`ablation-lr-1e-4-vs-3e-4` from `{"optim.lr": (1e-4, 3e-4)}` (key -> (baseline, variant)).

    Several keys are joined with `+` (`ablation-lr+bs-1e-4+8-vs-3e-4+16`): an ablation should change
    one, and the name should show when it did not. More than a few keys name the runs instead.
    """
    if not changed:
        return f"ablation-none-{_clean(baseline_run)}-vs-{_clean(run)}"
    keys = sorted(changed)
    if len(keys) > _MAX_GROUP_KEYS:
        return f"ablation-{len(keys)}keys-{_clean(baseline_run)}-vs-{_clean(run)}"
    component = "+".join(_short(k) for k in keys)
    old = "+".join(_value(changed[k][0]) for k in keys)
    new = "+".join(_value(changed[k][1]) for k in keys)
    return f"ablation-{component}-{old}-vs-{new}"


def _short(key: str) -> str:
    return _ABBREVIATIONS.get(key, key.rsplit(".", 1)[-1].replace("_", ""))


def _value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return _list([str(v) for v in value])
    return _clean(_number(str(value)))


def _list(items: list[str]) -> str:
    """A list of names run together, layer-name suffixes dropped: `[q_proj, k_proj, v_proj]` -> `qkv`."""
    out = []
    for item in items:
        for suffix in _LAYER_SUFFIXES:
            item = item.removesuffix(suffix)
        out.append(_clean(item))
    return "".join(out) or "none"


def _number(value: str) -> str:
    """Small and large floats in short scientific form, however they were typed: `0.0001` -> `1e-4`."""
    if not any(c in value for c in ".eE"):
        return value
    try:
        v = float(value)
    except ValueError:
        return value
    if v != 0 and (abs(v) < 0.01 or abs(v) >= 1e5):
        mantissa, exponent = f"{v:e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{v:g}"


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "", text.replace("/", "-"))
