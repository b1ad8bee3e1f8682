"""A model's weights under torchtitan's Llama-3 names, built independently of the code under test:
the renames and the rotary permutation as torchtitan's own adapter (Llama3StateDictAdapter) does
them, restated."""

from __future__ import annotations

import torch

TITAN = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
         "lm_head.weight": "output.weight", "self_attn.q_proj.weight": "attention.wq.weight",
         "self_attn.k_proj.weight": "attention.wk.weight", "self_attn.v_proj.weight": "attention.wv.weight",
         "self_attn.o_proj.weight": "attention.wo.weight", "mlp.gate_proj.weight": "feed_forward.w1.weight",
         "mlp.down_proj.weight": "feed_forward.w2.weight", "mlp.up_proj.weight": "feed_forward.w3.weight",
         "input_layernorm.weight": "attention_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight"}


def titan_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """torchtitan's `_permute` (its to_hf direction)."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_to_titan(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """torchtitan's `_reverse_permute` (its from_hf direction)."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def titan_state(state: dict[str, torch.Tensor], heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in state.items():
        if name in TITAN:
            out[TITAN[name]] = p.clone()
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        w = p.clone()
        if rest.endswith("q_proj.weight"):
            w = hf_to_titan(w, heads)
        elif rest.endswith("k_proj.weight"):
            w = hf_to_titan(w, kv_heads)
        out[f"layers.{layer}.{TITAN[rest]}"] = w.contiguous()
    return out
