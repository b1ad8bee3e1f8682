"""The model families the one decoder builds, as data: what config.json says of each, and the
switches of the decoder it turns on. Pure, and low in the house: the config checks `model.family`
against these names, and model/families.py reads a pretrained directory's family from them.

    llama    LlamaForCausalLM     the base layout: RMSNorm, RoPE (Llama-3.1 scaling), SwiGLU, GQA
    qwen2    Qwen2ForCausalLM     + biases on q, k and v (Qwen2 and Qwen2.5 share model_type qwen2)
    qwen3    Qwen3ForCausalLM     + a per-head RMSNorm on q and k; head_dim set apart from hidden/heads
    mistral  MistralForCausalLM   Llama's layout, with a sliding attention window in its config
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str
    qkv_bias: bool
    """Biases on q, k and v (and none on o)."""
    qk_norm: bool
    refused_flags: tuple[str, ...]
    """config.json flags that must be false or absent: layers the decoder does not have."""


FAMILIES = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", qkv_bias=False, qk_norm=False, refused_flags=("attention_bias", "mlp_bias")),
    Family("qwen2", "Qwen2ForCausalLM", qkv_bias=True, qk_norm=False, refused_flags=()),
    Family("qwen3", "Qwen3ForCausalLM", qkv_bias=False, qk_norm=True, refused_flags=("attention_bias",)),
    Family("mistral", "MistralForCausalLM", qkv_bias=False, qk_norm=False, refused_flags=("attention_bias", "mlp_bias")),
)}
"""Each family by config.json's model_type."""
