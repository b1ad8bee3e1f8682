"""What a Hugging Face model directory holds, as data: the shard plan, file names, the index, and the
config.json and generation_config.json of a model.

config.json is written in the classic spelling (`rope_theta` and `rope_scaling` at top level, the
dtype under both `torch_dtype` and `dtype`): transformers 4.x and vLLM read it, and transformers 5
converts it to its own `rope_parameters` on load.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resilient_slurm.config import ModelConfig
from resilient_slurm.config.families import FAMILIES

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SAFETENSORS_METADATA = {"format": "pt"}
"""transformers refuses a safetensors file without it."""
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack",
                   "*.index.json")
"""Files of a base directory not copied into an export: weights in any format and their indexes
(plus hidden entries such as .cache/ and .git*); everything else (tokenizer, chat template,
generation config, README, LICENSE) is."""


@dataclass(frozen=True)
class Shard:
    file: str
    names: tuple[str, ...]
    nbytes: int


def plan_shards(sizes: Sequence[tuple[str, int]], max_shard_bytes: int) -> list[Shard]:
    """Tensors (name, bytes in the output dtype), in order, cut into files of at most max_shard_bytes;
    a tensor larger than that gets a file of its own, as transformers does."""
    groups: list[list[tuple[str, int]]] = []
    total = 0
    for name, nbytes in sizes:
        if not groups or total + nbytes > max_shard_bytes:
            groups.append([])
            total = 0
        groups[-1].append((name, nbytes))
        total += nbytes
    count = len(groups)
    return [Shard(SINGLE_FILE if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors",
                  tuple(n for n, _ in group), sum(b for _, b in group)) for i, group in enumerate(groups)]


def index(shards: Sequence[Shard]) -> dict[str, Any]:
    """model.safetensors.index.json's contents."""
    return {"metadata": {"total_size": sum(s.nbytes for s in shards)},
            "weight_map": {name: s.file for s in shards for name in s.names}}


def model_config(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """config.json for a model with no base directory (trained from random weights), in its family's
    spelling: the keys each family's transformers config reads (Qwen2 has q/k/v biases without a
    flag; Qwen3 reads attention_bias for all four projections, so it stays false)."""
    out = {
        "architectures": [FAMILIES[cfg.family].architecture],
        "model_type": cfg.family,
        "torch_dtype": dtype,
        "dtype": dtype,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim or cfg.hidden_size // cfg.num_heads,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": _eos(cfg),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "use_cache": True,
    }
    if cfg.family != "llama":
        out["sliding_window"] = cfg.sliding_window
    if cfg.family in ("qwen2", "qwen3"):
        out["use_sliding_window"] = False
    return out


def config_from_base(base: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The base model's config.json with only its dtype changed, so nothing of the base is lost."""
    out = dict(base)
    keys = [k for k in ("torch_dtype", "dtype") if k in out] or ["torch_dtype", "dtype"]
    for key in keys:
        out[key] = dtype
    return out


def generation_config(cfg: ModelConfig) -> dict[str, Any]:
    """generation_config.json when neither the base nor the tokenizer directory has one."""
    out: dict[str, Any] = {"eos_token_id": _eos(cfg)}
    if cfg.bos_token_id is not None:
        out["bos_token_id"] = cfg.bos_token_id
    return out


def copied(relative_path: str) -> bool:
    """Whether a base directory's file (path relative to it) is carried into the export."""
    if relative_path == "config.json":
        return False  # rewritten from the base's, with the export's dtype
    parts = relative_path.split("/")
    if any(part.startswith(".") for part in parts):
        return False
    return not any(fnmatch.fnmatch(parts[-1], pattern) for pattern in WEIGHT_PATTERNS)


def _eos(cfg: ModelConfig) -> int | list[int] | None:
    ids = list(cfg.eos_token_id)
    return None if not ids else ids[0] if len(ids) == 1 else ids
