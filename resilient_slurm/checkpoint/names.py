"""Tensor names in other frameworks' checkpoints: torchtitan's Llama-3 names for our (Hugging Face)
ones, and the rotary permutation between them. Pure.

torchtitan's Llama applies the rotary embedding to interleaved pairs of each head's dimensions
(Meta's layout); Hugging Face's to its two halves. So the rows of `wq` and `wk` are ordered
differently within each head: Hugging Face row `a * head_dim / 2 + i` of a head is torchtitan row
`2 * i + a` of it (a in {0, 1}). torchtitan's own adapter to Hugging Face permutes them the same way.
"""

from __future__ import annotations

import re

from resilient_slurm.checkpoint.chunks import Box

NAMINGS = ("hf", "torchtitan")
"""hf: our own names (Hugging Face's, as `model.state_dict()` gives them); torchtitan: Llama-3's."""

_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight"}
_LAYER = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
          "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
          "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
          "mlp.up_proj.weight": "feed_forward.w3.weight", "input_layernorm.weight": "attention_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight"}
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_TT_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
EMBEDDING = {"hf": "model.embed_tokens.weight", "torchtitan": "tok_embeddings.weight"}
"""A tensor every Llama has, by which a DCP directory's naming and key prefix are recognised."""


def to_torchtitan(name: str) -> str | None:
    """torchtitan's name for one of ours, or None when torchtitan's Llama has no such tensor."""
    if name in _TOP:
        return _TOP[name]
    m = _HF_LAYER.match(name)
    if m and m.group(2) in _LAYER:
        return f"layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    return None


def from_torchtitan(name: str) -> str | None:
    """Our name for one of torchtitan's, or None."""
    top = {v: k for k, v in _TOP.items()}
    if name in top:
        return top[name]
    m = _TT_LAYER.match(name)
    layer = {v: k for k, v in _LAYER.items()}
    if m and m.group(2) in layer:
        return f"model.layers.{m.group(1)}.{layer[m.group(2)]}"
    return None


def rename(name: str, naming: str, to_ours: bool) -> str | None:
    if naming == "hf":
        return name
    return from_torchtitan(name) if to_ours else to_torchtitan(name)


def rotary(name: str) -> str | None:
    """"q" or "k" for our names of the tensors whose rows the rotary permutation reorders."""
    if name.endswith("self_attn.q_proj.weight"):
        return "q"
    if name.endswith("self_attn.k_proj.weight"):
        return "k"
    return None


def whole_heads(box: Box, head_dim: int) -> Box:
    """The rows of whole heads that hold `box`'s rows: the permutation stays inside a head, so
    these rows of one layout hold every row of `box` in the other."""
    first = box.offsets[0] // head_dim * head_dim
    last = -(-box.ends[0] // head_dim) * head_dim
    return Box((first, *box.offsets[1:]), (last - first, *box.lengths[1:]))
