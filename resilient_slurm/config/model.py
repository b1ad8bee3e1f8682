"""`model.*`: the decoder's dimensions, where its weights come from, LoRA."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.config.families import FAMILIES as CATALOG
from resilient_slurm.config.checks import Problems

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama decoder layer (Hugging Face names): what LoRA can adapt."""
DTYPES = ("float32", "bfloat16")
FAMILIES = tuple(CATALOG)
"""Model families the decoder builds (config.json's model_type): config/families.py says how each differs."""


@dataclass
class LoRAConfig:
    rank: int | None = None
    """Train LoRA adapters of this rank on `targets` instead of every weight; null: a full fine-tune.
    The base model is frozen (held in bfloat16, rebuilt from its files at every start); the
    adapters train in float32. Checkpoints hold the adapters, their optimizer state and the base's
    identity; hf/ then holds a PEFT adapter (`python -m resilient_slurm.export RUN OUT --merge`
    writes the merged model)."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank (PEFT's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (PEFT's lora_dropout)."""
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Layers of every decoder layer that get adapters, by name: the attention projections by
    default; any of LORA_TARGETS (the MLP's gate_proj, up_proj, down_proj too)."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.rank is None or self.rank >= 1,
               f"model.lora.rank: {self.rank}; set a rank of 1 or more, or null for a full fine-tune")
        p.need(self.alpha > 0, f"model.lora.alpha: {self.alpha}; set it > 0 (the adapters are scaled by alpha / rank)")
        p.need(0 <= self.dropout < 1, f"model.lora.dropout: {self.dropout}; set it within [0, 1)")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        p.need(not unknown and bool(self.targets),
               f"model.lora.targets: {unknown[0]!r} matches no layer of the model; use some of "
               f"{', '.join(LORA_TARGETS)}" if unknown else
               f"model.lora.targets: empty; use some of {', '.join(LORA_TARGETS)}")
        return p


@dataclass
class ModelConfig:
    pretrained: str | None = None
    """A Hugging Face model directory of a supported family (FAMILIES: Llama, Qwen2/2.5, Qwen3, Mistral) (config.json, safetensors weights, tokenizer files) to
    fine-tune. Its config.json sets every dimension below at launch (none is copied by hand); the
    weights are read shard by shard, each rank only its own rows. Null: random initialisation."""
    config: str | None = None
    """A Hugging Face model directory (or its config.json) whose dimensions the model takes, with
    random weights: pretraining a known architecture from scratch. Ignored with `pretrained`."""
    dcp: str | None = None
    """A torch.distributed.checkpoint directory (the one holding `.metadata`) whose model weights
    the run starts from, each rank reading only its own part of every tensor, at the run's own
    sharding, whatever sharding saved it. Its names are recognised: ours (Hugging Face's, as
    `model.state_dict()` gives them) or torchtitan's Llama-3 (tok_embeddings, layers.N.attention.wq,
    ...; wq and wk are permuted to our rotary layout), at the top or under one prefix (`model.`).
    The dimensions come from the config as usual (`config` sets them from an HF config.json), and a
    tensor the checkpoint lacks or holds in another shape stops the run with one line. A later
    resume loads the run's own checkpoints, not this. Not with `pretrained`, nor with LoRA."""
    family: str = "llama"
    """The architecture's family (FAMILIES), from config.json's model_type when `pretrained` is set;
    it names the class an export's config.json gives transformers."""
    name: str = "llama-tiny"
    """Short model name, used in generated run names (the directory's name when `pretrained` is set)."""
    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    """Grouped-query attention: key/value heads shared by num_heads // num_kv_heads query heads."""
    head_dim: int | None = None
    """Per-head dimension; null: hidden_size // num_heads."""
    max_seq_len: int = 256
    """Longest sequence the model is trained on (HF max_position_embeddings)."""
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """HF rope_scaling, e.g. Llama-3.1's {rope_type: llama3, factor: 8, low_freq_factor: 1,
    high_freq_factor: 4, original_max_position_embeddings: 8192}; null: none."""
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2 / Qwen2.5)."""
    qk_norm: bool = False
    """An RMSNorm over each head's dimension on q and k, before the rotary embedding (Qwen3)."""
    sliding_window: int | None = None
    """The attention window the model was trained with (Mistral's sliding_window; Qwen2's when
    use_sliding_window is on); null: none. The decoder attends over the whole row, which is the
    same computation only while data.seq_len fits in the window, so a shorter one is refused."""
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    """Written to the exported config.json; from the pretrained config, else from the tokenizer."""
    dtype: str = "float32"
    """Compute dtype (float32 or bfloat16). Master weights, gradients' reduction and AdamW state are
    always float32 (FSDP2 MixedPrecisionPolicy): bf16 parameters lose small updates on long runs.
    With `lora.rank`, the frozen base is held in bfloat16 whatever this says (it never updates)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass: ~1/25 of the activation
    memory for about a third more compute."""
    compile: bool = False
    """Compile each decoder layer with torch.compile (inductor), as torchtitan does: under FSDP2,
    tensor and pipeline parallelism alike, after tensor parallelism and before FSDP2. The first step
    pays the compilation (about a minute per distinct layer shape on a CPU)."""
    init_std: float = 0.02
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def problems(self) -> list[str]:
        p = Problems()
        # An explicit head_dim (Qwen3's, Gemma-style) need not be hidden_size / num_heads.
        p.need(self.head_dim is not None or self.hidden_size % self.num_heads == 0,
               f"model.hidden_size: {self.hidden_size} is not divisible by model.num_heads={self.num_heads}; change one")
        p.need(self.num_heads % self.num_kv_heads == 0,
               f"model.num_kv_heads: {self.num_kv_heads} does not divide model.num_heads={self.num_heads}; pick a "
               f"divisor")
        p.need((self.head_dim or self.hidden_size // max(self.num_heads, 1)) % 2 == 0,
               "model.hidden_size: head dim must be even for rotary embeddings; change hidden_size or num_heads")
        p.need(self.family in FAMILIES, f"model.family: {self.family!r} unknown; use one of {', '.join(FAMILIES)}")
        p.need(self.dtype in DTYPES, f"model.dtype: {self.dtype!r} unknown; use one of {', '.join(DTYPES)}")
        p.need(not (self.dcp and self.pretrained),
               "model.dcp: set with model.pretrained; the initial weights come from one of them, so unset the other")
        p.need(not (self.dcp and self.lora.rank is not None),
               "model.dcp: LoRA adapters train on a model.pretrained base (an HF directory); unset model.dcp or "
               "model.lora.rank")
        p.extend_new(self.lora.problems())
        return p
