"""The one decoder: Llama's architecture (RMSNorm, rotary embeddings with Llama-3.1 scaling, SwiGLU,
grouped-query attention) in the layout of Hugging Face's `LlamaForCausalLM`, with the switches the
other supported families need (families.py): biases on q, k, v (Qwen2), a per-head RMSNorm on q and
k and a head_dim of its own (Qwen3). Mistral is Llama's layout.

Parameter names follow HF (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, ...) and the
rotary convention is HF's `rotate_half`, so pretrained weights load without any permutation and an
export loads into `transformers` 1:1. Inputs may be packed: `position_ids` restart at each
document and `document_ids` keep attention inside a document (a block-diagonal causal mask), so
packed documents train exactly as they would one per row.

A module may hold one slice of the decoder (`Part`): a pipeline stage's layers, with the embedding
on the first stage and the final norm and head on the last. Layers are keyed by their global index
(`model.layers.17...`, the names the whole model has), so a stage's parameters, checkpoints and
exports carry the same names at every layout. With tied embeddings, the last stage holds its own
copy of `model.embed_tokens.weight` as its head (parallel/pipeline.py keeps the copies in step).

Parameters are created in float32: they are the master weights (FSDP2 casts a bf16 copy for compute,
see parallel/fsdp.py). Rotary tables are computed from `position_ids` on every call (a few
thousand multiplications), so the module has no buffers to rebuild after it is built on the meta
device.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from resilient_slurm.config import ModelConfig

IGNORE_INDEX = -100


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def head_dim(cfg: ModelConfig) -> int:
    return cfg.head_dim or cfg.hidden_size // cfg.num_heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def inverse_frequencies(cfg: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """RoPE inverse frequencies, with Llama-3.1's `rope_scaling` (type `llama3`) applied when set:
    long wavelengths are divided by `factor`, short ones kept, the band between interpolated."""
    dim = head_dim(cfg)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    scaling = cfg.rope_scaling
    if not scaling:
        return inv
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv
    low_wavelength, high_wavelength = original / low, original / high
    smooth = (original / wavelength - low) / (high - low)
    interpolated = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelength > low_wavelength, inv / factor, inv)
    middle = (wavelength <= low_wavelength) & (wavelength >= high_wavelength)
    return torch.where(middle, interpolated, out)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = head_dim(cfg)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        # Qwen3: q and k normalised per head (over head_dim) before the rotary embedding.
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism a rank's projections hold its own heads only.
        q = self.q_proj(x).view(b, s, -1, self.head_dim)
        k = self.k_proj(x).view(b, s, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.num_kv_heads != self.num_heads:
            repeat = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass(frozen=True)
class Part:
    """The slice of the decoder one module holds: a pipeline stage, or the whole model."""

    layers: tuple[int, ...]
    """Global indices of the decoder layers it holds, ascending."""
    first: bool
    """It embeds the tokens (the first stage): its input is token ids, else hidden states."""
    last: bool
    """It holds the final norm and the head (the last stage): its output is logits."""


def whole(cfg: ModelConfig) -> Part:
    return Part(tuple(range(cfg.num_layers)), first=True, last=True)


class LlamaModel(nn.Module):
    embed_tokens: nn.Embedding | None
    norm: RMSNorm | None

    def __init__(self, cfg: ModelConfig, part: Part | None = None) -> None:
        super().__init__()
        part = part or whole(cfg)
        self.cfg = cfg
        self.first = part.first
        # A tied head is the embedding's weight: a last stage holds a copy of it, under its name.
        holds_embedding = part.first or (part.last and cfg.tie_embeddings)
        # Registered even when absent, so that a module set later keeps the whole model's order.
        self.register_module("embed_tokens", nn.Embedding(cfg.vocab_size, cfg.hidden_size) if holds_embedding else None)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg) for i in part.layers})
        self.register_module("norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if part.last else None)
        self.activation_checkpointing = False
        """Recompute each layer's activations in the backward pass instead of keeping them."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """`x`: token ids (batch, seq) on the first part, else the previous part's hidden states."""
        if self.first:
            assert self.embed_tokens is not None
            b, s = x.shape
            x = self.embed_tokens(x)
        else:  # under sequence parallelism a rank holds s / tp of it: a pipeline passes position_ids
            b, s = x.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(s, device=x.device).expand(b, s)
        angles = position_ids[..., None].float() * inverse_frequencies(self.cfg, x.device)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (b, 1, s, head_dim): one table for all heads
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        mask = None if document_ids is None else block_causal_mask(document_ids)
        for layer in self.layers.values():
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return self.norm(x) if self.norm is not None else x


def block_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(b, 1, s, s) bool: query t may attend key u when u <= t in the same document. Padding
    (document -1) attends to padding only, so no query row is empty (an empty row gives NaN)."""
    s = document_ids.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=document_ids.device).tril()
    return (document_ids[:, :, None] == document_ids[:, None, :]).logical_and(causal)[:, None]


class LlamaForCausalLM(nn.Module):
    lm_head: nn.Linear | None

    def __init__(self, cfg: ModelConfig, part: Part | None = None) -> None:
        super().__init__()
        part = part or whole(cfg)
        self.model = LlamaModel(cfg, part)
        self.register_module("lm_head", nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if part.last else None)
        if cfg.tie_embeddings and self.lm_head is not None:
            assert self.model.embed_tokens is not None
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, shape (batch, seq, vocab); a part without the head returns its hidden states."""
        h = self.model(x, position_ids, document_ids)
        return self.lm_head(h) if self.lm_head is not None else h


def init_value(name: str, shape: tuple[int, ...], cfg: ModelConfig, seed: int) -> torch.Tensor:
    """The random initial value of parameter `name` (the whole tensor): ones for norms, zeros for
    biases, normal(0, init_std) for the rest, drawn from (seed, name) alone, so every rank and every world size
    starts from the same weights, whatever order the parameters are visited in."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=generator) * cfg.init_std


@torch.no_grad()
def plain_model(cfg: ModelConfig, seed: int) -> LlamaForCausalLM:
    """The model unsharded, with its random initial values: for code without a process group
    (benchmarks, tests); training builds it sharded (parallel/fsdp.py) from the same values."""
    model = LlamaForCausalLM(cfg)
    for name, p in model.named_parameters():
        p.copy_(init_value(name, tuple(p.shape), cfg, seed))
    return model


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over target positions (IGNORE_INDEX positions, e.g. prompts, excluded).

    Vocabulary-parallel logits (a DTensor sharded on the vocabulary: tensor parallelism's head)
    must come under `torch.distributed.tensor.parallel.loss_parallel()`, their backward too: each
    rank then computes from its slice of the vocabulary, and the whole logits are never gathered.
    The sum is the same on every TP rank; it is returned as a plain tensor. (Not under
    inference_mode: there cross_entropy reaches DTensor whole, and loss_parallel knows its parts.)"""
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )
    return loss.to_local() if isinstance(loss, DTensor) else loss


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
