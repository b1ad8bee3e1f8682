"""Run names: `{model}-{task}-{date}-{variant}`, the variant spelled from the overrides. Pure."""

from __future__ import annotations

import re
from datetime import date

from resilient_slurm.config import Config

# How an override's key is abbreviated in a variant (`optim.lr=1e-4` -> `lr1e-4`).
_ABBREVIATIONS = {
    "optim.lr": "lr",
    "data.global_batch_size": "bs",
    "data.micro_batch_size": "mbs",
    "data.seq_len": "seq",
    "train.seed": "seed",
    "train.max_steps": "steps",
    "optim.warmup_steps": "warmup",
    "optim.weight_decay": "wd",
    "model.num_layers": "layers",
    "model.hidden_size": "d",
    "cluster.ranks": "ranks",
}
# Overrides of where or how a run executes, not what it computes: never part of a variant.
_PLACEMENT = ("run.", "cluster.", "checkpoint.", "monitor.", "health.", "fault.", "hydra.", "hydra/", "train.log_every_steps",
              "train.threads")
# Group choices the name already spells (model, task) or that do not change what is computed.
_NAMED_GROUPS = ("experiment", "model", "data", "cluster", "checkpoint")


def variant(overrides: list[str]) -> str:
    parts = []
    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if not sep or key.startswith(_PLACEMENT) or key in _NAMED_GROUPS:
            continue
        if "." not in key:  # another group's choice, e.g. `lora=r16`
            parts.append(f"{_clean(key)}-{_clean(value)}")
        else:
            short = _ABBREVIATIONS.get(key, key.rsplit(".", 1)[-1].replace("_", ""))
            parts.append(f"{short}{_clean(_number(value))}")
    return "-".join(parts) or "base"


def run_name(cfg: Config, overrides: list[str], today: date) -> str:
    return f"{_clean(cfg.model.name)}-{_clean(cfg.data.task)}-{today:%Y%m%d}-{variant(overrides)}"


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
