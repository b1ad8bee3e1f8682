"""How a pretrained directory's family is read and what it switches on in the one decoder. Pure.
The families themselves are one catalog, `config/families.py` (the config checks names against it).

Decision: one decoder with switches (`ModelConfig.qkv_bias`, `qk_norm`, `head_dim`), not a module per
family. The families differ in a handful of tensors, and everything downstream (FSDP2 sharding, byte
ranges, checkpoints, LoRA, export) keys on Hugging Face's parameter names, which these families
share; a copy per family would repeat all of that to change three lines.

A sliding window is not implemented: the decoder attends over the whole row, which computes the
same as a window only while the row fits in it. `sliding_window` records the window the checkpoint
declares, and the config check refuses a `data.seq_len` longer than it (config/schema.py).
Everything else (another model_type, a mixture of experts, biases this layout does not have) is
refused by name, with the list of what is supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resilient_slurm.config.families import FAMILIES, Family
from resilient_slurm.errors import InputError


class PretrainedError(InputError):
    """The pretrained directory cannot be used; the message is one line naming it and what is wrong."""


SUPPORTED = ", ".join(f"{f.model_type} ({f.architecture})" for f in FAMILIES.values())


def family_of(config: Mapping[str, Any], directory: str) -> Family:
    """The family config.json's `model_type` and `architectures` name, or PretrainedError naming both
    and listing the supported ones."""
    model_type = config.get("model_type")
    architectures = list(config.get("architectures") or [])
    family = FAMILIES.get(str(model_type))
    if family is None:
        named = f"model_type {model_type}" + (f" ({', '.join(architectures)})" if architectures else "")
        raise PretrainedError(f"{directory}: {named} is not supported; resilient_slurm fine-tunes {SUPPORTED}")
    for arch in architectures:
        if arch != family.architecture:
            raise PretrainedError(f"{directory}: architecture {arch} is not supported for model_type {model_type}; "
                                  f"resilient_slurm fine-tunes {SUPPORTED}")
    for flag in family.refused_flags:
        if config.get(flag):
            raise PretrainedError(f"{directory}: config.json sets {flag}: true; the {family.architecture} layout here "
                                  "has no such biases, so this checkpoint is not supported")
    return family


def switches(config: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The ModelConfig fields that set the decoder up as this family."""
    return {"family": family.model_type, "qkv_bias": family.qkv_bias, "qk_norm": family.qk_norm,
            "sliding_window": sliding_window(config, family)}


def sliding_window(config: Mapping[str, Any], family: Family) -> int | None:
    """The window some layer attends within, or None. Mistral's applies whenever it is set; Qwen's
    only when `use_sliding_window` is on (transformers 4) or a layer type says so (transformers 5)."""
    window = config.get("sliding_window")
    if window is None or family.model_type == "llama":
        return None
    if family.model_type == "mistral":
        return int(window)
    sliding_layers = "sliding_attention" in (config.get("layer_types") or [])
    return int(window) if config.get("use_sliding_window") or sliding_layers else None
