"""The model sharded over every rank with FSDP2, built without ever holding it whole.

The model is built on the meta device (no memory), each decoder layer and then the root are
`fully_shard`ed over the run's mesh, storage for the shards is allocated (`to_empty`), and each rank
fills only its own rows of every parameter: from the pretrained files (byte ranges of its rows), or
from the random initial values, which are defined per tensor so that every world size starts from
the same weights.

Precision: parameters, their gradients and AdamW's state are float32 (the master copy); FSDP2 casts
a `model.dtype` copy for the forward and backward, and reduces gradients in float32.

With LoRA (`model.lora.rank`), only the adapters train, in float32; the frozen base is held in
bfloat16 (half the memory of its shards, and no master copy: it never updates). Base and adapters
share each decoder layer's unit: FSDP2 shards per parameter, so one unit may mix dtypes, provided
the policy names the compute dtype, so that the all-gather casts both to it (bf16 base up to fp32
for a float32 run, fp32 adapters down to bf16 for a bf16 run). Without it a float32 run would meet
bf16 weights in its matmuls. Measured (torch 2.13, 2 gloo ranks; see the LoRA issue's report):
bf16 base + fp32 adapters ran with `param_dtype` fp32 and bf16, and failed without one; adapters in
units of their own were not needed. For a full fine-tune, `param_dtype` = float32 casts nothing, as
no `param_dtype` did (same bits). Gradients are
summed over ranks, not averaged: the step divides the loss by the global token count itself, so a
step means the same at any world size. gloo has no pre-scaled sum, so reductions are plain sums
(`set_force_sum_reduction_for_comms`).

Sharding is FSDP2's: dim 0 of every parameter cut in `world` chunks of ceil(rows / world) rows, the
last ones shorter or empty (`checkpoint.layout.shard_rows`); checkpoints record each rank's rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from resilient_slurm.checkpoint.state import local_rows
from resilient_slurm.config import ModelConfig
from resilient_slurm.model.lora import (
    BASE_DTYPE,
    adapter_value,
    apply_lora,
    hold_base_in,
    is_adapter,
)
from resilient_slurm.model.decoder import LlamaForCausalLM, init_value

FillRows = Callable[[str, tuple[int, ...], int, int, torch.Tensor], None]
"""rows_of(name, global shape, start, stop, out): write rows [start, stop) of parameter `name` into
`out`."""


def build_model(cfg: ModelConfig, mesh: DeviceMesh, device: torch.device) -> LlamaForCausalLM:
    """The sharded model with its storage allocated but not yet filled (see `fill_random`,
    `fill_pretrained`)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    prepare(model, cfg, mesh, reshard_after_forward=None)
    model.to_empty(device=device)
    return model


def prepare(model: LlamaForCausalLM, cfg: ModelConfig, mesh: DeviceMesh, reshard_after_forward: bool | None) -> None:
    """Everything a model (or a pipeline stage) gets before its storage is allocated, in one place,
    in torchtitan's order: LoRA adapters, activation checkpointing, then FSDP2 units (each decoder
    layer, then the root). `reshard_after_forward`: None is FSDP2's default (layers shard again after
    their forward, the root keeps its weights for the backward that starts there); False under
    pipeline parallelism keeps every unit's weights gathered from its forward to its backward, as
    torchtitan does: a stage runs several micro-batches' forwards before their backwards, and would
    gather again for each otherwise."""
    if cfg.lora.rank is not None:
        apply_lora(model, cfg.lora)
        hold_base_in(model, BASE_DTYPE)
    model.model.activation_checkpointing = cfg.activation_checkpointing
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.dtype), reduce_dtype=torch.float32)
    for layer in model.model.layers.values():
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root unit holds the embedding, the final norm and the head (tied or not): those a stage has.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


@torch.no_grad()
def fill(model: nn.Module, rows_of: FillRows) -> None:
    """Each rank writes its own rows of every parameter (a tied weight once)."""
    for name, p in model.named_parameters():
        start, stop = local_rows(p)
        local = p.to_local() if isinstance(p, DTensor) else p
        rows_of(name, tuple(p.shape), start, stop, local)


def random_rows(cfg: ModelConfig, seed: int) -> FillRows:
    def rows_of(name: str, shape: tuple[int, ...], start: int, stop: int, out: torch.Tensor) -> None:
        # The whole tensor is drawn (one at a time) so its values do not depend on the world size.
        out.copy_(init_value(name, shape, cfg, seed)[start:stop])

    return rows_of


def with_adapters(base: FillRows, seed: int) -> FillRows:
    """`base` for the base model's parameters, the adapters' initial values for theirs."""
    def rows_of(name: str, shape: tuple[int, ...], start: int, stop: int, out: torch.Tensor) -> None:
        if is_adapter(name):
            out.copy_(adapter_value(name, shape, seed)[start:stop])
        else:
            base(name, shape, start, stop, out)

    return rows_of


def fill_random(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    fill(model, with_adapters(random_rows(cfg, seed), seed))
