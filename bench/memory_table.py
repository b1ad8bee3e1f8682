"""The llama8b_sft memory table for 8 x 80 GB GPUs, from activation bytes measured on our own model.

    python bench/memory_table.py [--seqs 256 512] [--seq 4096] [--micro 1 2 4] [--ranks 8] [--gpu-gib 79.6]
                                 [--no-hf]

What is measured (CPU, bf16, torch's own kernels; about a minute on 2 cores):
- one `model.decoder.DecoderLayer` at Llama-3-8B dimensions (hidden 4096, MLP 14336, 32 query and 8
  key/value heads), run forward on a (1, seq, 4096) input for each length in --seqs, under
  `torch.autograd.graph.saved_tensors_hooks` that record every tensor autograd keeps for the
  backward, counted once per storage, parameters left out (FSDP2 frees the unsharded weights
  between forward and backward; they are in the parameter terms below). Without activation
  checkpointing, and with it exactly as `LlamaModel` applies it
  (`torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, use_reentrant=False)`). The rotary
  tables and the attention mask are made once per forward and shared by all layers, so they are
  counted apart. "masked" is the training path (`StepRunner` always passes document ids, so SDPA gets
  a block-causal boolean mask); "causal" is SDPA's is_causal path without a mask.
- the head at two short lengths: what the final norm and `lm_head` (vocab 128256) save (hooks), what
  `token_loss_sum` saves (the bf16 logits cast to float32, cross-entropy), and the peak of live
  bytes through the loss's forward and backward (the CPU allocator's own records, through
  torch.profiler's memory events).
- optionally (transformers installed, not --no-hf) the same hooks on transformers'
  `LlamaDecoderLayer` with SDPA, the layer sft-facts.md section 3 measured (196.6 KiB/token).

Each quantity is measured at two or more lengths and fitted per row as linear * s + quadratic * s**2,
which checks the growth: everything is linear except on the masked path, where SDPA turns the
boolean mask into a bf16 s x s additive mask in every layer and keeps it for the backward (on a GPU
the memory-efficient kernel, the one that takes a mask, needs it as an additive bias too: expected,
not verified here).

The table then adds the parameter arithmetic per rank (FSDP2 over --ranks GPUs): fp32 master
weights, fp32 gradients and AdamW's two fp32 moments (16 B/param / ranks); FSDP2's
transients: the root unit (embedding, final norm, lm_head) stays unsharded in bf16 through forward
and backward (`fully_shard` keeps a root's parameters after forward), lm_head's bf16 gradient is
held from the start of the backward to the root's reduce-scatter at its end, two decoder layers are
unsharded at once (the current one and the prefetched one), and in the backward the current
layer's bf16 gradients plus their fp32 copy for the float32 reduce-scatter. The terms are added as
if they all coexisted at the top of the backward, where activations peak: an upper bound by about
the head's gradient. Not modelled: allocator fragmentation (use expandable_segments), and the CUDA
context, NCCL and cuBLAS workspaces, which --reserve-gib stands for (an assumption, not a
measurement). Holds for the kernels measured: on a GPU, flash or memory-efficient attention saves
the same tensors as CPU's flash kernel (q, k, v, output, log-sum-exp). The byte counts do not depend
on the machine's speed or load, so one run suffices (no repetitions, no medians).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.config import ModelConfig  # noqa: E402
from resilient_slurm.model.decoder import (  # noqa: E402
    DecoderLayer,
    LlamaForCausalLM,
    RMSNorm,
    block_causal_mask,
    head_dim,
    inverse_frequencies,
    token_loss_sum,
)

LLAMA3_8B = ModelConfig(
    name="Meta-Llama-3.1-8B", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
    num_heads=32, num_kv_heads=8, max_seq_len=131072, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
    dtype="bfloat16", activation_checkpointing=True,
)
"""Llama-3.1-8B's config.json as ModelConfig values (what `model.pretrained` sets at launch)."""
LLAMA3_8B_PARAMS = 8_030_261_248
SFT_FACTS_KIB = 196.6
"""sft-facts.md section 3: transformers' LlamaDecoderLayer (SDPA), bf16, saved-tensor hooks."""
KIB, GIB = 1024, 1024**3
STATE_BYTES_PER_PARAM = 16
"""fp32 master weight, fp32 gradient, AdamW exp_avg and exp_avg_sq (fp32)."""


@dataclass(frozen=True)
class Saved:
    """What autograd keeps for the backward of one forward: bytes per storage."""

    storages: dict[int, tuple[int, torch.dtype, tuple[int, ...]]]
    """storage address → (bytes, dtype, shape of the first tensor saved from it)."""

    @property
    def nbytes(self) -> int:
        return sum(n for n, _, _ in self.storages.values())


def saved_by(fn: Callable[[], object], leave_out: set[int]) -> Saved:
    """Run `fn` and record the storages autograd saves, except those at `leave_out` addresses.

    The output is dropped only after counting: while the graph lives, no saved storage is freed,
    so no address is reused for another."""
    storages: dict[int, tuple[int, torch.dtype, tuple[int, ...]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in leave_out and key not in storages and storage.nbytes():
            storages[key] = (storage.nbytes(), t.dtype, tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    saved = Saved(storages)
    del out
    return saved


def addresses(tensors: Sequence[torch.Tensor | None]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None}


@torch.no_grad()
def bf16_layer(cfg: ModelConfig) -> DecoderLayer:
    """One decoder layer in bf16 with small random weights (their values do not change what is saved)."""
    with torch.device("meta"):
        layer = DecoderLayer(cfg)
    layer = layer.to_empty(device="cpu").to(torch.bfloat16)
    for name, p in layer.named_parameters():
        p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
    return layer


def rotary(cfg: ModelConfig, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin as `LlamaModel.forward` makes them: (1, 1, seq, head_dim), bf16."""
    positions = torch.arange(seq)[None]
    angles = positions[..., None].float() * inverse_frequencies(cfg)
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


@dataclass(frozen=True)
class LayerBytes:
    per_layer: int
    """Bytes one layer keeps for the backward (inputs and activations)."""
    shared: int
    """Bytes every layer shares (rotary tables, mask), kept once per forward."""
    saved: Saved


def measure_layer(layer: DecoderLayer, cfg: ModelConfig, seq: int, checkpointed: bool, masked: bool) -> LayerBytes:
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rotary(cfg, seq)
    # One document per row: the mask's shape, not its pattern, decides what is saved.
    mask = block_causal_mask(torch.zeros(1, seq, dtype=torch.long)) if masked else None
    shared = addresses([cos, sin, mask])
    params = addresses(list(layer.parameters()))
    if checkpointed:
        saved = saved_by(lambda: checkpoint(layer, x, cos, sin, mask, use_reentrant=False), params)
    else:
        saved = saved_by(lambda: layer(x, cos, sin, mask), params)
    per_layer = sum(n for key, (n, _, _) in saved.storages.items() if key not in shared)
    return LayerBytes(per_layer, saved.nbytes - per_layer, saved)


def measure_hf_layer(cfg: ModelConfig, seq: int) -> int | None:
    """Bytes transformers' LlamaDecoderLayer (SDPA, no mask) saves; None without transformers."""
    try:
        import transformers
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )
    except ImportError:
        return None
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=1, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        rms_norm_eps=cfg.rms_norm_eps)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, layer_idx=0)
    with torch.no_grad():
        layer = layer.to_empty(device="cpu").to(torch.bfloat16)
        for name, p in layer.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
    layer.train()
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(seq)[None]
    cos, sin = LlamaRotaryEmbedding(config)(x, positions)
    leave_out = addresses([*layer.parameters(), cos, sin])
    saved = saved_by(lambda: layer(x, position_ids=positions, position_embeddings=(cos, sin)), leave_out)
    return saved.nbytes


@dataclass(frozen=True)
class HeadBytes:
    head_saved: int
    """Bytes the final norm and lm_head keep for the backward (their input sides)."""
    loss_saved: int
    """Bytes token_loss_sum keeps for the backward (the float32 log-probabilities)."""
    loss_peak: int
    """Peak live bytes through token_loss_sum's forward and backward, from the moment lm_head has
    produced the bf16 logits: the logits, their float32 copy, the log-probabilities, the gradients.
    Includes `loss_saved`."""


def measure_head(cfg: ModelConfig, seq: int) -> HeadBytes:
    targets = torch.randint(0, cfg.vocab_size, (1, seq))
    # A leaf stands for lm_head's output side; its copy is the logits the loss receives.
    source = torch.randn(1, seq, cfg.vocab_size, dtype=torch.bfloat16, requires_grad=True)
    loss_saved = saved_by(lambda: token_loss_sum(source.clone(), targets), set()).nbytes
    return HeadBytes(head_saved(cfg, seq), loss_saved, peak_bytes(lambda: _loss_forward_backward(source, targets)))


def head_saved(cfg: ModelConfig, seq: int) -> int:
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps).to(torch.bfloat16)
    lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lm_head.weight.normal_(0.0, 0.02)
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    return saved_by(lambda: lm_head(norm(x)), addresses([*norm.parameters(), *lm_head.parameters()])).nbytes


def _loss_forward_backward(source: torch.Tensor, targets: torch.Tensor) -> None:
    logits = source.clone()
    loss = token_loss_sum(logits, targets)
    del logits  # the caller of lm_head drops the logits once the loss is built (trainer/step.py)
    loss.backward()


def peak_bytes(fn: Callable[[], None]) -> int:
    """Peak of live CPU-allocator bytes while `fn` runs, above where it started (allocations and
    frees as torch.profiler's memory events record them, in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


@dataclass(frozen=True)
class Growth:
    """Bytes of one row as a function of its length s: linear * s + quadratic * s**2."""

    linear: float
    """Bytes per token."""
    quadratic: float
    """Bytes per token squared (an s x s attention mask)."""

    def at(self, seq: int) -> float:
        return self.linear * seq + self.quadratic * seq * seq


def fit(bytes_at: dict[int, float]) -> Growth:
    """The growth through bytes measured at two or more lengths (least squares beyond two)."""
    lengths = sorted(bytes_at)
    if len(lengths) < 2:
        raise ValueError("fit needs bytes at two or more sequence lengths")
    a = np.array([[s, s * s] for s in lengths], dtype=np.float64)
    b = np.array([bytes_at[s] for s in lengths], dtype=np.float64)
    (linear, quadratic), *_ = np.linalg.lstsq(a, b, rcond=None)
    return Growth(float(linear), float(quadratic))


@dataclass(frozen=True)
class Activations:
    """Measured growth of what one row keeps, per term."""

    layer: Growth
    """One layer, no activation checkpointing."""
    layer_checkpointed: Growth
    """One layer with activation checkpointing (its saved inputs)."""
    shared: Growth
    """Rotary tables and mask, once per forward."""
    head_saved: Growth
    """Final norm and lm_head."""
    loss_peak: Growth


@dataclass(frozen=True)
class ParamBytes:
    """Per-rank parameter-side bytes (the arithmetic; nothing here is measured)."""

    params: int
    states: float
    """fp32 master + gradient + AdamW moments, sharded over the ranks."""
    root_bf16: float
    """Embedding + final norm + lm_head unsharded in bf16 (FSDP2 root: kept through the backward)."""
    head_grad_bf16: float
    """lm_head's bf16 gradient, held until the root's reduce-scatter at the end of the backward."""
    layer_bf16: float
    """One decoder layer unsharded in bf16."""


def param_bytes(cfg: ModelConfig, ranks: int) -> ParamBytes:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    layer = sum(p.numel() for p in model.model.layers["0"].parameters())
    root = params - cfg.num_layers * layer
    head = cfg.vocab_size * cfg.hidden_size
    return ParamBytes(params, STATE_BYTES_PER_PARAM * params / ranks, 2.0 * root, 2.0 * head, 2.0 * layer)


@dataclass(frozen=True)
class Row:
    micro: int
    checkpointed: bool
    states: float
    fsdp: float
    activations: float
    head: float
    peak: float
    end_of_backward: float


def memory_row(p: ParamBytes, a: Activations, layers: int, seq: int, micro: int, checkpointed: bool) -> Row:
    """One configuration's per-rank bytes; see the module docstring for what each term holds."""
    # Backward: the current and the prefetched layer's bf16 weights, the current one's bf16
    # gradients, and their fp32 copy for the reduce-scatter (2 x the bf16 bytes).
    fsdp = p.root_bf16 + p.head_grad_bf16 + 5 * p.layer_bf16
    if checkpointed:
        # Each layer keeps its inputs; the one in its backward is recomputed in full.
        activations = micro * (layers * a.layer_checkpointed.at(seq) + a.layer.at(seq) + a.shared.at(seq))
    else:
        activations = micro * (layers * a.layer.at(seq) + a.shared.at(seq))
    head = micro * (a.head_saved.at(seq) + a.loss_peak.at(seq))
    peak = p.states + fsdp + activations + head
    # After the backward: activations are gone; the root's bf16 weights, its bf16 gradients and
    # their fp32 copy for the reduce-scatter (embedding and lm_head) are live.
    end = p.states + p.root_bf16 + p.root_bf16 + 2 * p.root_bf16
    return Row(micro, checkpointed, p.states, fsdp, activations, head, max(peak, end), end)


def verdict(peak: float, capacity: float) -> str:
    if peak <= 0.9 * capacity:
        return "fits"
    return "tight (<10% free)" if peak <= capacity else "does not fit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 512], help="lengths measured on the CPU (2+)")
    parser.add_argument("--head-seqs", type=int, nargs="+", default=[32, 64],
                        help="lengths for the head (2+; lm_head at vocab 128256 is 34 GFLOP per 32 tokens)")
    parser.add_argument("--seq", type=int, default=4096, help="the table's sequence length")
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4], help="micro-batch sizes in the table")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--gpu-gib", type=float, default=79.6,
                        help="memory of one GPU (an 80 GB H100 reports 81559 MiB = 79.6 GiB)")
    parser.add_argument("--reserve-gib", type=float, default=2.0,
                        help="kept back for the CUDA context, NCCL and cuBLAS workspaces (assumed)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' layer")
    args = parser.parse_args()
    if len(set(args.seqs)) < 2 or len(set(args.head_seqs)) < 2:
        parser.error("--seqs and --head-seqs each need two or more different lengths")
    torch.manual_seed(0)
    cfg = LLAMA3_8B
    p = param_bytes(cfg, args.ranks)
    if p.params != LLAMA3_8B_PARAMS:
        raise SystemExit(f"memory_table: the model has {p.params:,} parameters, Llama-3-8B has {LLAMA3_8B_PARAMS:,}")

    layer = bf16_layer(cfg)
    cases = {"no AC, causal": (False, False), "no AC, masked": (False, True), "AC, masked": (True, True)}
    measured: dict[str, dict[int, LayerBytes]] = {c: {} for c in cases}
    for seq in args.seqs:
        for case, (checkpointed, masked) in cases.items():
            measured[case][seq] = measure_layer(layer, cfg, seq, checkpointed, masked)
    del layer
    rows: dict[str, dict[int, float]] = {f"ours, {c}": {s: m.per_layer for s, m in by_seq.items()}
                                         for c, by_seq in measured.items()}
    if not args.no_hf:
        hf = {seq: measure_hf_layer(cfg, seq) for seq in args.seqs}
        if all(v is not None for v in hf.values()):
            rows["transformers LlamaDecoderLayer, SDPA, no mask"] = {s: float(v) for s, v in hf.items() if v}
    rows["shared per forward: rotary tables + mask"] = {s: m.shared for s, m in measured["no AC, masked"].items()}
    heads = {seq: measure_head(cfg, seq) for seq in args.head_seqs}
    rows["head: final norm + lm_head, saved"] = {s: h.head_saved for s, h in heads.items()}
    rows["loss (token_loss_sum), saved"] = {s: h.loss_saved for s, h in heads.items()}
    rows["loss, peak live through forward + backward"] = {s: h.loss_peak for s, h in heads.items()}
    growth = {name: fit(values) for name, values in rows.items()}

    print(f"Bytes kept for the backward per token, Llama-3-8B dimensions, bf16, CPU (torch {torch.__version__}); "
          f"saved-tensor hooks, parameters left out; per decoder layer unless it says otherwise. "
          f"Fit: bytes(s) = linear*s + quadratic*s^2 per row.")
    print("| what | " + " | ".join(f"KiB/token at {s}" for s in sorted(set(args.seqs) | set(args.head_seqs))) +
          f" | linear KiB/token | quadratic B/token^2 | KiB/token at {args.seq} |")
    all_seqs = sorted(set(args.seqs) | set(args.head_seqs))
    print("|---|" + "---|" * (len(all_seqs) + 3))
    for name, values in rows.items():
        g = growth[name]
        cells = [f"{values[s] / s / KIB:.2f}" if s in values else "" for s in all_seqs]
        print(f"| {name} | " + " | ".join(cells) +
              f" | {g.linear / KIB:.2f} | {g.quadratic:.3f} | {g.at(args.seq) / args.seq / KIB:.2f} |")
    seq = args.seqs[-1]
    print()
    print(f"What our layer keeps without AC (masked, seq {seq}), KiB per token, by storage:")
    items = sorted(measured["no AC, masked"][seq].saved.storages.values(), key=lambda v: -v[0])
    print("  " + ", ".join(f"{n / seq / KIB:g} {str(dt).removeprefix('torch.')}{list(shape)}"
                           for n, dt, shape in items))
    print()

    a = Activations(growth["ours, no AC, masked"], growth["ours, AC, masked"],
                    growth["shared per forward: rotary tables + mask"],
                    growth["head: final norm + lm_head, saved"], growth["loss, peak live through forward + backward"])
    capacity = (args.gpu_gib - args.reserve_gib) * GIB
    print(f"llama8b_sft per GPU: FSDP2 over {args.ranks} GPUs, {p.params:,} parameters, fp32 master weights + "
          f"AdamW ({STATE_BYTES_PER_PARAM} B/param / {args.ranks}), bf16 compute, seq {args.seq}, the training "
          f"path's block-causal mask; GiB")
    print(f"Capacity: {args.gpu_gib} GiB - {args.reserve_gib} GiB reserve (CUDA context, NCCL; assumed) = "
          f"{capacity / GIB:.1f} GiB; 'fits' leaves >=10% of it free.")
    print("| AC | micro-batch | params+grads+AdamW | FSDP transients | activations | logits+loss | peak | "
          "end of backward | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for checkpointed in (False, True):
        for micro in args.micro:
            r = memory_row(p, a, cfg.num_layers, args.seq, micro, checkpointed)
            print(f"| {'on' if checkpointed else 'off'} | {micro} | {r.states / GIB:.1f} | {r.fsdp / GIB:.1f} | "
                  f"{r.activations / GIB:.1f} | {r.head / GIB:.1f} | {r.peak / GIB:.1f} | "
                  f"{r.end_of_backward / GIB:.1f} | {verdict(r.peak, capacity)} |")
    print(f"FSDP transients: root unit bf16 {p.root_bf16 / GIB:.2f} + lm_head bf16 grad {p.head_grad_bf16 / GIB:.2f} "
          f"+ 5 x one layer in bf16 {p.layer_bf16 / GIB:.2f} (2 unsharded, its bf16 grads, their fp32 copy). "
          f"With AC, activations include one layer recomputed in full.")
    ours = growth["ours, no AC, masked"].at(args.seq) / args.seq / KIB
    line = (f"sft-facts.md section 3 measured {SFT_FACTS_KIB} KiB/token/layer on transformers' layer; ours is "
            f"{ours:.1f} KiB at seq {args.seq} (x{ours / SFT_FACTS_KIB:.2f})")
    hf_name = "transformers LlamaDecoderLayer, SDPA, no mask"
    if hf_name not in growth:
        print(line)
        return
    theirs = growth[hf_name].linear / KIB
    print(line + f"; transformers' layer measured here: {theirs:.2f} KiB. Why they differ:")
    gqa = 2 * 2 * (cfg.num_heads - cfg.num_kv_heads) * head_dim(cfg) / KIB
    print(f"- {growth['ours, no AC, causal'].linear / KIB - theirs:.2f} KiB: we repeat_interleave k and v to all "
          f"{cfg.num_heads} query heads before SDPA, so it keeps them {cfg.num_heads // cfg.num_kv_heads}x larger "
          f"(2 tensors x 2 B x ({cfg.num_heads} - {cfg.num_kv_heads}) heads x {head_dim(cfg)} = {gqa:.2f} KiB); "
          "transformers passes enable_gqa=True when there is no mask")
    mask = growth["ours, no AC, masked"].at(args.seq) - growth["ours, no AC, causal"].at(args.seq)
    print(f"- {mask / args.seq / KIB:.2f} KiB at seq {args.seq}: the block-causal mask, which SDPA copies to a bf16 "
          "s x s bias in every layer and keeps (2 B x seq per token); transformers' layer ran without a mask")
    rotary = growth["shared per forward: rotary tables + mask"].linear / KIB
    print(f"- {SFT_FACTS_KIB - theirs:.2f} KiB between sft-facts.md and transformers' layer here: about the rotary "
          f"tables' {rotary:.2f} KiB/token, which a per-layer count that gets cos and sin passed in includes and this "
          "table counts once per forward (likely; sft-facts.md does not say)")


if __name__ == "__main__":
    main()
