"""What a run will hold and move, from its config alone, before anything starts (`launch --plan`).
[pure]

Per rank, for the rank that holds the most (the first of every ceil-divided shard):
- the static state: float32 parameters (a LoRA run's frozen base in bfloat16), float32 gradients and
  AdamW's two float32 moments, each tensor cut as the run cuts it: by tensor parallelism first
  (column-parallel by rows, row-parallel by columns, the vocabulary-parallel tables by rows, norms
  whole), then FSDP2's dim-0 shards of that over dp_shard. HSDP replicas hold the same shards.
- the activations one micro-batch keeps for the backward, derived from what the decoder's autograd
  graph saves (model/decoder.py; the terms below, in bytes per token, e the compute dtype's bytes):
    each RMSNorm: its float32 input (4h), the normalised input in e (e*h), its rsqrt (4), and its
      output in e when the next op needs it (the q/k/v and gate/up matmuls: e*h);
    attention: q, k and v after the rotary embedding and the GQA repeat (3*e*q), the output (e*q),
      the log-sum-exp (4 per head); o_proj's input is the output's view; Qwen3's q/k norms add
      (4 + e) per element of q and k and 4 per head; document masks add SDPA's additive s x s mask
      in e, in every layer (e*s per token);
    the MLP: gate, silu(gate), up and their product, down_proj's input (4*e*f);
    with activation checkpointing a layer keeps only its input (e*h), and the layer in its backward
      is recomputed whole;
    once per forward: the final norm, the log-probabilities in float32 (4*V), the rotary tables
      (2*e*head_dim), the token ids and targets (16), the boolean document mask (s).
  Under tensor parallelism with sequence parallelism the norms see 1/tp of the tokens, attention
  and the MLP 1/tp of the features and heads, the log-probabilities 1/tp of the vocabulary; each
  norm's output is kept all-gathered (e*h per token, whole): DTensor's all-gather keeps its output
  for the matmuls, where Megatron gathers again in the backward. A compiled block keeps less.
- FSDP2's transients, in e: the root unit (embedding, final norm, head) gathered through the step,
  the current and the prefetched layer gathered, and in the backward one layer's gradients (and
  their float32 copy when e is 2); the logits and their float32 copy at the loss. Estimated, not
  checked: the saved activations and the static state are (tests/unit/parallel/test_estimate.py
  measures both on real runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resilient_slurm.config import Config, Layout, ModelConfig, layout

FP32 = 4
ADAM_MOMENTS = 2


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    """The dim tensor parallelism cuts (0: column-parallel and the vocabulary tables; 1: row-parallel),
    None: whole on every TP rank."""
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def local_numel(self, tp: int, dp_shard: int) -> int:
        """Elements the most-loaded rank holds: TP's cut, then FSDP2's dim-0 shards of it."""
        shape = list(self.shape)
        if self.tp_dim is not None:
            shape[self.tp_dim] = -(-shape[self.tp_dim] // tp)
        shape[0] = -(-shape[0] // dp_shard)
        return math.prod(shape)


def head_dim(m: ModelConfig) -> int:
    return m.head_dim or m.hidden_size // m.num_heads


def layer_params(m: ModelConfig) -> list[ParamSpec]:
    """One decoder layer's parameters (names inside the layer), LoRA adapters included."""
    h, f, q, kv = m.hidden_size, m.intermediate_size, m.num_heads * head_dim(m), m.num_kv_heads * head_dim(m)
    base = m.lora.rank is None
    linears = {"self_attn.q_proj": ((q, h), 0), "self_attn.k_proj": ((kv, h), 0), "self_attn.v_proj": ((kv, h), 0),
               "self_attn.o_proj": ((h, q), 1), "mlp.gate_proj": ((f, h), 0), "mlp.up_proj": ((f, h), 0),
               "mlp.down_proj": ((h, f), 1)}
    out = [ParamSpec("input_layernorm.weight", (h,), None, base),
           ParamSpec("post_attention_layernorm.weight", (h,), None, base)]
    for name, (shape, tp_dim) in linears.items():
        out.append(ParamSpec(f"{name}.weight", shape, tp_dim, base))
        if m.qkv_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            out.append(ParamSpec(f"{name}.bias", (shape[0],), 0, base))
        if m.lora.rank is not None and name.rpartition(".")[2] in m.lora.targets:
            r, colwise = m.lora.rank, tp_dim == 0
            out.append(ParamSpec(f"{name}.lora_A.weight", (r, shape[1]), None if colwise else 1))
            out.append(ParamSpec(f"{name}.lora_B.weight", (shape[0], r), 0 if colwise else None))
    if m.qk_norm:
        out += [ParamSpec(f"self_attn.{n}.weight", (head_dim(m),), None, base) for n in ("q_norm", "k_norm")]
    return out


def root_params(m: ModelConfig) -> list[ParamSpec]:
    """The parameters outside the layers: the embedding, the final norm, the head unless tied."""
    base = m.lora.rank is None
    out = [ParamSpec("model.embed_tokens.weight", (m.vocab_size, m.hidden_size), 0, base),
           ParamSpec("model.norm.weight", (m.hidden_size,), None, base)]
    if not m.tie_embeddings:
        out.append(ParamSpec("lm_head.weight", (m.vocab_size, m.hidden_size), 0, base))
    return out


def all_params(m: ModelConfig) -> list[ParamSpec]:
    return root_params(m) + [p for _ in range(m.num_layers) for p in layer_params(m)]


def dtype_bytes(m: ModelConfig) -> int:
    return 2 if m.dtype == "bfloat16" else 4


@dataclass(frozen=True)
class StaticBytes:
    """One rank's resident state (the most-loaded rank; pipeline stages split the layers)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def static_bytes(m: ModelConfig, lay: Layout) -> StaticBytes:
    """Parameters, gradients and AdamW state on the most-loaded rank; with pipeline stages, the
    first stage's share (the embedding and ceil(layers / pp) layers; the head sits on the last)."""
    layers = -(-m.num_layers // lay.pp)
    root = [p for p in root_params(m) if lay.pp == 1 or p.name == "model.embed_tokens.weight"]
    held = root + [p for _ in range(layers) for p in layer_params(m)]
    params = grads = optimizer = 0
    for p in held:
        n = p.local_numel(lay.tp, lay.dp_shard)
        if p.trainable:
            params += FP32 * n
            grads += FP32 * n
            optimizer += ADAM_MOMENTS * FP32 * n + FP32  # AdamW's step count: one float32 per tensor
        else:
            params += 2 * n  # a LoRA run's frozen base, held in bfloat16
    return StaticBytes(params, grads, optimizer)


@dataclass(frozen=True)
class ActivationBytes:
    """What one micro-batch keeps for its backward on one rank."""

    layer: float
    """One decoder layer, without activation checkpointing."""
    layer_checkpointed: float
    """One decoder layer's saved input with activation checkpointing."""
    once: float
    """The final norm, the log-probabilities, the rotary tables, ids, targets and mask."""
    layers: int

    def total(self, checkpointed: bool) -> float:
        if checkpointed:  # every layer its input, and the one in its backward recomputed whole
            return self.layers * self.layer_checkpointed + self.layer + self.once
        return self.layers * self.layer + self.once


def _norm(h: int, e: int, t: int, trainable: bool) -> float:
    """An RMSNorm's saved bytes per token (the module docstring), output excluded; a frozen weight
    (LoRA) needs no normalised input for its gradient."""
    return (FP32 * h + (e * h if trainable else 0) + FP32) / t


def activation_bytes(m: ModelConfig, lay: Layout, seq: int, micro: int, documents: bool) -> ActivationBytes:
    """Saved activations of one micro-batch of `micro` rows of `seq` tokens (`documents`: rows of
    packed documents, so SDPA gets a mask). Under LoRA a frozen linear keeps its input only when an
    adapter on it (or a sibling sharing the input) needs it, and each adapter keeps its rank-sized
    middle (the first layer, whose input needs no gradient, keeps less: not modelled)."""
    e, t, h, f = dtype_bytes(m), lay.tp, m.hidden_size, m.intermediate_size
    hd = head_dim(m)
    q, kv, heads, kv_heads = m.num_heads * hd, m.num_kv_heads * hd, m.num_heads, m.num_kv_heads
    full = m.lora.rank is None
    adapted = set() if full else set(m.lora.targets)

    def keeps(*names: str) -> bool:
        return full or bool(adapted & set(names))

    attention = (3 * e * q + e * q + FP32 * heads) / t
    if m.qk_norm:
        attention += ((FP32 + (e if full else 0)) * (q + kv) + FP32 * (heads + kv_heads)) / t
    mask = e * seq if documents else 0
    mlp = 3 * e * f / t + (e * f / t if keeps("down_proj") else 0)
    adapters = e * (m.lora.rank or 0) * len(adapted) / t  # each adapter's middle, sharded like its base's output
    norm_out = e * h
    layer = (2 * _norm(h, e, t, full) + norm_out * keeps("q_proj", "k_proj", "v_proj")
             + norm_out * keeps("gate_proj", "up_proj") + attention + mask + mlp + adapters)
    once = _norm(h, e, t, full) + (e * h if full else 0) + FP32 * m.vocab_size / t + 2 * e * hd + 16 + \
        (seq if documents else 0)
    tokens = seq * micro
    layers = -(-m.num_layers // lay.pp)
    return ActivationBytes(tokens * layer, tokens * e * h / t, tokens * once, layers)


def transient_bytes(m: ModelConfig, lay: Layout, seq: int, micro: int) -> float:
    """FSDP2's gathered weights and a layer's unsharded gradients, and the logits at the loss (the
    module docstring)."""
    e, t = dtype_bytes(m), lay.tp
    layer = sum(p.local_numel(t, 1) for p in layer_params(m))
    root = sum(p.local_numel(t, 1) for p in root_params(m))
    grads = layer * (e + (FP32 if e != FP32 else 0))
    logits = seq * micro * m.vocab_size / t * (e + (FP32 if e != FP32 else 0))
    return e * root + 2 * e * layer + grads + logits


def checkpoint_bytes(m: ModelConfig, lay: Layout) -> int:
    """Bytes of one checkpoint one rank writes: the float32 trainable weights and AdamW moments of
    its shards (a LoRA checkpoint holds the adapters alone). Each chunk is written once, spread
    over the ranks that hold it alike (HSDP replicas; TP ranks for what TP does not cut), so a rank
    writes its box divided by the holders (checkpoint/plan.py balances by bytes)."""
    layers = -(-m.num_layers // lay.pp)
    root = [p for p in root_params(m) if lay.pp == 1 or p.name == "model.embed_tokens.weight"]
    written = 0.0
    for p in root + [p for _ in range(layers) for p in layer_params(m)]:
        if p.trainable:
            holders = lay.dp_replicate * (lay.tp if p.tp_dim is None else 1)
            written += (1 + ADAM_MOMENTS) * FP32 * p.local_numel(lay.tp, lay.dp_shard) / holders
    return math.ceil(written)


def checkpoint_bytes_per_rank(cfg: Config) -> int:
    """Bytes one rank writes per checkpoint of a composed recipe at its configured size: what
    `launch --plan` prints, for the simulator's scenario (`Scenario.ckpt_bytes`)."""
    lay = layout(cfg)
    if isinstance(lay, str):
        raise ValueError(lay)
    return checkpoint_bytes(cfg.model, lay)


@dataclass(frozen=True)
class Collective:
    """One kind of collective in a step: on which group, how many, how many bytes in all."""

    what: str
    group: str
    size: int
    """Ranks in the group."""
    count: int
    """Per step, on each rank."""
    nbytes: float
    """Bytes of the whole tensors over the step: what an all-gather gathers, what a reduce-scatter
    or an all-reduce reduces."""


def collectives(cfg: Config, lay: Layout) -> list[Collective]:
    """Every collective a rank takes part in during one optimizer step (pp=1: no pipeline sends).

    Counted per micro-batch, as the code issues them (checked with a dispatch counter on 4 gloo
    ranks): FSDP2 all-gathers each unit in the forward and each layer again in the backward (the
    root stays gathered) and reduce-scatters each unit's gradients; HSDP all-reduces each unit's
    gradient shard over the replicas; TP all-gathers before attention, the MLP and the head, and
    reduce-scatters after o_proj, down_proj and the embedding (the backward mirrors both); the
    sequence-parallel norms' weight gradients all-reduce over TP; the OOM agreement
    (trainer/oom.py) counts one integer over every rank three times per FSDP2 unit, once after the
    last micro-batch, and under TP four times per communicating module (parallel/tp.py)."""
    m, d = cfg.model, cfg.data
    e, t = dtype_bytes(m), lay.tp
    layers = -(-m.num_layers // lay.pp)
    micro = max(d.global_batch_size // max(d.micro_batch_size * lay.dp, 1), 1)
    units = layers + 1
    layer = sum(p.local_numel(t, 1) for p in layer_params(m))
    root = sum(p.local_numel(t, 1) for p in root_params(m))
    unit_elems = layers * layer + root
    tokens = d.micro_batch_size * d.seq_len
    out = []
    if lay.dp_shard > 1:
        out.append(Collective("all-gather weights (FSDP2)", "dp_shard", lay.dp_shard, micro * (2 * layers + 1),
                              micro * e * (2 * layers * layer + root)))
        out.append(Collective("reduce-scatter gradients (FSDP2)", "dp_shard", lay.dp_shard, micro * units,
                              micro * FP32 * unit_elems))
    if lay.dp_replicate > 1:
        out.append(Collective("all-reduce gradient shards (HSDP)", "dp_replicate", lay.dp_replicate, micro * units,
                              micro * FP32 * unit_elems / lay.dp_shard))
    if t > 1:
        gathers = 2 * (2 * layers + 1)
        out.append(Collective("all-gather activations (TP, sequence parallel)", "tp", t, micro * gathers,
                              micro * gathers * e * m.hidden_size * tokens))
        out.append(Collective("reduce-scatter activations (TP, sequence parallel)", "tp", t, micro * gathers,
                              micro * gathers * e * m.hidden_size * tokens))
        out.append(Collective("all-reduce norm-weight gradients (TP)", "tp", t, micro * (2 * layers + 1),
                              micro * e * m.hidden_size * (2 * layers + 1)))
    world = lay.world_size
    agreements = micro * 3 * units + 1 + (micro * 4 * (4 * layers + 2) if t > 1 else 0)
    out.append(Collective("all-reduce OOM agreement (one integer)", "world", world, agreements, agreements * FP32))
    out.append(Collective("all-reduce token counts and loss", "world", world, 2, 2 * 16))
    out.append(Collective("all-reduce gradient norm", "every mesh", lay.dp_shard * lay.dp_replicate * t, 1, FP32))
    return out
