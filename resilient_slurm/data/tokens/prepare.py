"""`python -m resilient_slurm.data prepare`: build every source's order for a run, ahead of it and
off the GPU nodes, so a start only maps files (Megatron's tools/prepare_cache.py, as a step of ours).

The run's config is composed as `launch` composes it (Hydra overrides: `+experiment=NAME
data.sources=[...]`), or given as plain flags (`--source name=web,path=/data/tok/web,weight=0.7
--seq-len 4096 ...`). What is built is exactly what that run's start would build: each source's
scan, held-out windows and the epochs its budget (train.max_steps or train.max_tokens) reaches.
"""

from __future__ import annotations

import time
from typing import Any

from resilient_slurm.config import Config, ConfigError, SourceConfig, explicit_keys, to_config, to_dict
from resilient_slurm.data.tokens.token_data import open_token_data


def compose(overrides: list[str]) -> Config:
    """The config `python -m resilient_slurm.launch OVERRIDES` would run, checked as launch checks it
    (ConfigError, one line per problem)."""
    from resilient_slurm.config.composer import check_overrides
    from resilient_slurm.config.composer import compose as compose_tree
    from resilient_slurm.model.pretrained import apply_pretrained

    check_overrides(overrides)
    return to_config(compose_tree(overrides), explicit_keys(overrides), resolve_model=apply_pretrained)


def config_from_flags(sources: list[str], values: dict[str, Any]) -> Config:
    """A config from `--source name=..,path=..,weight=..[,dtype=..]` items and `data.x`/`train.x` values."""
    tree = to_dict(Config())
    tree["data"]["kind"] = "tokens"
    tree["data"]["sources"] = [_source(item) for item in sources]
    for key, value in values.items():
        if value is not None:
            section, name = key.split(".")
            tree[section][name] = value
    return to_config(tree, set(values))


def _source(item: str) -> dict[str, Any]:
    fields: dict[str, Any] = dict(SourceConfig().__dict__)
    for part in item.split(","):
        key, _, value = part.partition("=")
        if key not in fields or not value:
            raise ConfigError(f"--source {item}: {part!r} is not name=..., path=..., weight=... or dtype=...")
        try:
            fields[key] = float(value) if key == "weight" else value
        except ValueError:
            raise ConfigError(f"--source {item}: weight={value} is not a number; write weight=0.7") from None
    return fields


def prepare(cfg: Config) -> list[dict[str, Any]]:
    """Build what is missing; one row per source: what it holds and what building it cost."""
    start = time.perf_counter()
    data = open_token_data(cfg)
    rows = []
    for order in data.orders:
        s = order.source
        rows.append({"source": s.name, "files": len(s.files), "tokens": s.num_tokens, "windows": order.windows,
                     "val": order.val_sequences, "epochs": order.epochs_mapped, "built": len(order.report.built),
                     "build_s": round(order.report.seconds, 2), "index": order.entry})
    rows.append({"source": "(total)", "seconds": round(time.perf_counter() - start, 2)})
    return rows
