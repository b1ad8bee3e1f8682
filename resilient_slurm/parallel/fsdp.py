"""The model laid out over the run's mesh, built without ever holding it whole: tensor parallelism,
activation checkpointing, compiled blocks, then FSDP2 (HSDP when the mesh has replicas).

The model is built on the meta device (no memory), parallelized over the TP mesh (parallel/tp.py),
each decoder layer compiled when `model.compile` is set, each decoder layer and then the root
`fully_shard`ed over the data-parallel mesh, storage for the shards allocated (`to_empty`), and each
rank fills only its own box of every parameter: from the pretrained files (byte ranges of its rows),
or from the random initial values, which are defined per tensor so that every layout starts from
the same weights. This is torchtitan's order (TP, activation checkpointing, per-block compile,
FSDP): FSDP2 shards the TP-local tensors further along dim 0, and compiles see the TP collectives
and not FSDP2's hooks.

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
step means the same at any layout. gloo has no pre-scaled sum, so reductions are plain sums
(`set_force_sum_reduction_for_comms`). With HSDP the sum runs over both mesh dims (a reduce-scatter
inside the replica, an all-reduce across replicas).

Each rank holds one box of every parameter (FSDP2's rows of its TP shard): `local_box` says where
it sits in the whole tensor, and the fills write exactly that box.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from resilient_slurm.config import ModelConfig
from resilient_slurm.model.lora import (
    BASE_DTYPE,
    adapter_value,
    apply_lora,
    hold_base_in,
    is_adapter,
)
from resilient_slurm.model.decoder import LlamaForCausalLM, init_value
from resilient_slurm.parallel.tp import apply_tp

FillBox = Callable[[str, tuple[int, ...], tuple[int, ...], torch.Tensor], None]
"""box_of(name, global shape, offset, out): write the box of parameter `name` that starts at
`offset` (one global index per dim) and has `out`'s shape into `out`."""


def build_model(cfg: ModelConfig, mesh: DeviceMesh, device: torch.device,
                tp: DeviceMesh | None = None) -> LlamaForCausalLM:
    """The model laid out over `tp` (None: no tensor parallelism) and sharded over `mesh` (the
    data-parallel mesh: 2-D for HSDP), its storage allocated but not yet filled (`fill`)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    prepare(model, cfg, mesh, tp, reshard_after_forward=None)
    model.to_empty(device=device)
    return model


def prepare(model: LlamaForCausalLM, cfg: ModelConfig, mesh: DeviceMesh, tp: DeviceMesh | None,
            reshard_after_forward: bool | None) -> None:
    """Everything a model (or a pipeline stage) gets before its storage is allocated: LoRA adapters,
    the blocks made ready (`prepare_blocks`: TP, activation checkpointing, compile), then FSDP2 units
    over the data-parallel `mesh` (each decoder layer, then the root). `reshard_after_forward`: None is FSDP2's default (layers shard again after
    their forward, the root keeps its weights for the backward that starts there); False under
    pipeline parallelism keeps every unit's weights gathered from its forward to its backward, as
    torchtitan does: a stage runs several micro-batches' forwards before their backwards, and would
    gather again for each otherwise."""
    if cfg.lora.rank is not None:
        apply_lora(model, cfg.lora)
        hold_base_in(model, BASE_DTYPE)
    prepare_blocks(model, cfg, tp)
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.dtype), reduce_dtype=torch.float32)
    for layer in model.model.layers.children():
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root unit holds the embedding, the final norm and the head (tied or not): those a stage has.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def prepare_blocks(model: LlamaForCausalLM, cfg: ModelConfig, tp: DeviceMesh | None) -> None:
    """What comes before FSDP2, in torchtitan's order: tensor parallelism over `tp`, activation
    checkpointing, each decoder layer compiled (`model.compile`). The one place blocks are made
    ready, for every layout (a pipeline stage's model too)."""
    if tp is not None:
        apply_tp(model, tp, cfg)
    model.model.activation_checkpointing = cfg.activation_checkpointing
    if cfg.compile:
        no_compile_caches()
        for layer in model.model.layers.children():
            layer.compile()


def no_compile_caches() -> None:
    """Every launch compiles its blocks anew. With inductor's FX-graph and AOTAutograd caches on, a
    tensor-parallel block's backward loaded from the cache gave other gradients than the same
    backward compiled cold (grad norm 2.544 or 2.680 against 2.598 at step 1 of the same run, torch
    2.13 on CPU), so a resumed run, which finds the cache its first launch filled, was not
    bit-identical to its twin. The cost is the compilation at every start."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False


def local_box(p: torch.Tensor, local: torch.Tensor) -> tuple[int, ...]:
    """Where this rank's `local` part of parameter `p` starts in the whole tensor (one offset per
    dim): all zeros for a plain tensor."""
    if not isinstance(p, DTensor):
        return (0,) * p.ndim
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if tuple(shape) != tuple(local.shape):
        raise ValueError(f"{p.placements} holds a {list(local.shape)} box of a {list(p.shape)} tensor here, "
                         f"not {list(shape)}: its sharding is not one box per rank")
    return tuple(offset)


def box_slices(offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


@torch.no_grad()
def fill(model: nn.Module, box_of: FillBox) -> None:
    """Each rank writes its own box of every parameter (a tied weight once)."""
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        box_of(name, tuple(p.shape), local_box(p, local), local)


def random_box(cfg: ModelConfig, seed: int) -> FillBox:
    def box_of(name: str, shape: tuple[int, ...], offset: tuple[int, ...], out: torch.Tensor) -> None:
        # The whole tensor is drawn (one at a time) so its values do not depend on the layout.
        out.copy_(init_value(name, shape, cfg, seed)[box_slices(offset, tuple(out.shape))])

    return box_of


def with_adapters(base: FillBox, seed: int) -> FillBox:
    """`base` for the base model's parameters, the adapters' initial values for theirs."""
    def box_of(name: str, shape: tuple[int, ...], offset: tuple[int, ...], out: torch.Tensor) -> None:
        if is_adapter(name):
            out.copy_(adapter_value(name, shape, seed)[box_slices(offset, tuple(out.shape))])
        else:
            base(name, shape, offset, out)

    return box_of


def fill_random(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    fill(model, with_adapters(random_box(cfg, seed), seed))
