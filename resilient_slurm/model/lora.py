"""LoRA: low-rank adapters trained on a frozen Llama, in the layout `peft` and vLLM read.

Written here (about a hundred lines) rather than taken from `peft`, as the native PyTorch trainers
(torchtune, torchtitan) do, because peft does not fit how this project builds its model:
- peft wraps each target as `q_proj.base_layer` plus adapters, renaming every base weight; our
  pretrained loading, checkpoints and export all key on Hugging Face's names;
- peft creates and initialises the adapters itself on a materialised model; ours is built on the
  meta device, sharded by FSDP2, then each rank fills only its rows, from values defined per tensor
  so that any world size starts from the same weights (and resumes onto any other);
- peft inside FSDP is known friction (fp32 adapters beside a bf16 base in one unit, LlamaFactory
  #10157; its adapter-only state dicts confusing full-state loading).
What users need from peft is its file format, and `export/` writes it: `peft.PeftModel` and vLLM's
`--lora-modules` load our adapters (tested with peft itself, which stays a test-only oracle).

A target `nn.Linear` becomes a `LoRALinear` that keeps its `weight` under the same name, so the base
loads and exports as before, and adds `lora_A` (rank x in) and `lora_B` (out x rank): PEFT's names,
so an adapter's PEFT key is ours behind `base_model.model.`. Its output is PEFT's, in PEFT's order:
`base(x) + lora_B(lora_A(dropout(x))) * alpha / rank`, base(x) with the base's bias where it has one.
The targets are named the same way in every supported family (q_proj ... down_proj).

A starts uniform in +-1/sqrt(in) (kaiming-uniform with a = sqrt(5), PEFT's and torchtune's default)
and B at zero, so a new adapter changes nothing: step 1 trains on exactly the base model.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from resilient_slurm.config import LoRAConfig
from resilient_slurm.errors import InputError

ADAPTER_MARKERS = (".lora_A.", ".lora_B.")
BASE_DTYPE = torch.bfloat16
"""How the frozen base is held under LoRA (parallel/fsdp.py): it never updates, so it needs no
float32 master copy."""


class LoRAError(InputError):
    """LoRA cannot be applied as configured; the message is one line naming the key and the fix."""


class LoRALinear(nn.Linear):
    """A frozen linear layer plus a trainable low-rank update."""

    lora_A: nn.Linear
    lora_B: nn.Linear
    scaling: float

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        # Built on meta, then given the base's own weight (and bias: Qwen2's q, k, v have one): no
        # second copy of either is ever allocated, and both keep their Hugging Face names.
        super().__init__(base.in_features, base.out_features, bias=False, device="meta")
        self.weight = base.weight
        self.bias = base.bias
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device)
        self.lora_dropout: nn.Module = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Put adapters on every decoder-layer linear named in `cfg.targets` and freeze everything
    else; returns the adapted modules' names. The model may be on the meta device."""
    assert cfg.rank is not None
    found: dict[str, list[str]] = {t: [] for t in cfg.targets}
    candidates: set[str] = set()
    for name, module in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        if not isinstance(module, nn.Linear) or ".layers." not in f".{parent}.":
            continue  # lm_head is no target: PEFT and vLLM treat a LoRA head apart
        candidates.add(child)
        if child in found:
            setattr(model.get_submodule(parent), child, LoRALinear(module, cfg.rank, cfg.alpha, cfg.dropout))
            found[child].append(name)
    for target, names in found.items():
        if not names:
            raise LoRAError(f"model.lora.targets: {target!r} matches no layer of the model; use some of "
                            f"{', '.join(sorted(candidates))}")
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return [name for names in found.values() for name in names]


def is_adapter(name: str) -> bool:
    """Whether parameter `name` belongs to an adapter (`...q_proj.lora_A.weight`)."""
    return any(marker in name for marker in ADAPTER_MARKERS)


def hold_base_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Convert the frozen parameters to `dtype` (in place, so tied weights stay tied); adapters stay
    float32."""
    model.to(dtype)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            module.lora_A.float()
            module.lora_B.float()


def adapter_value(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of adapter parameter `name` (the whole tensor), drawn from (seed, name)
    alone, so every rank and world size starts from the same adapters."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1.0 / math.sqrt(shape[1])
    return torch.rand(shape, generator=generator) * (2 * bound) - bound


def merged_weight(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """The base weight with its adapter folded in, in float32: W + scaling * B @ A."""
    return weight.float() + (lora_b.float() @ lora_a.float()) * scaling
