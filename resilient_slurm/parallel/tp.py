"""Tensor parallelism (DTensor) with sequence parallelism, as plans: which style each module of the
decoder gets, per family where the families differ.

The plan is Megatron's and torchtitan's for a Llama block:
- q, k, v, gate and up are column-parallel (each TP rank computes its heads, its share of the MLP);
  o and down are row-parallel, their partial sums reduce-scattered back to sequence shards;
- the norms are sequence-parallel: between blocks the activations are split along the sequence,
  so each rank normalises and holds 1/tp of them; an all-gather before attention and the MLP
  (PrepareModuleInput) gives each rank the whole sequence;
- the embedding is vocabulary-parallel (each rank its rows of the table, outputs summed and
  scattered along the sequence) and so is the head (each rank its slice of the vocabulary): the
  logits stay a DTensor sharded on the vocabulary, and the loss is computed without gathering them
  (`loss_parallel`, model/decoder.py `token_loss_sum`);
- Qwen3's q and k norms act per head: they see the local heads as a tensor sharded on the heads
  dim, their weight replicated, its gradient summed over the TP ranks (torchtitan's choice);
- Qwen2's q, k, v biases are split with their weights (ColwiseParallel shards both).
Attention runs on the local heads (the decoder views its projections with -1 heads).

A tied head and embedding share one table: both styles shard it by rows (the vocabulary), so after
parallelizing the head's weight is pointed back at the embedding's. LoRA targets get `ShardedLoRA`:
the adapters sharded like their base (a column-parallel base's B by rows, A whole; a row-parallel
base's A by columns, B whole), so the adapter's output is laid out as the base's.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from resilient_slurm.config import ModelConfig
from resilient_slurm.model.lora import LoRALinear

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
"""Qwen3 (ModelConfig.qk_norm): an RMSNorm per head on q and k."""


def block_plan(cfg: ModelConfig) -> dict[str, ParallelStyle]:
    """The styles of one decoder layer's modules, by name inside the layer."""
    plan: dict[str, ParallelStyle] = {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                        desired_input_layouts=(Replicate(), None, None, None)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        **{name: ColwiseParallel() for name in COLWISE},
        **{name: RowwiseParallel(output_layouts=Shard(1)) for name in ROWWISE},
    }
    if cfg.qk_norm:
        # (batch, seq, local heads, head_dim): sharded on the heads dim.
        plan.update({name: SequenceParallel(sequence_dim=2, use_local_output=True) for name in QK_NORMS})
    return plan


def root_plan() -> dict[str, ParallelStyle]:
    """The styles of the modules outside the layers, by name in LlamaForCausalLM."""
    return {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }


COMMUNICATING = ("self_attn", "mlp", "self_attn.o_proj", "mlp.down_proj")
"""A layer's modules whose styles issue collectives (PrepareModuleInput's all-gathers, RowwiseParallel's
reduce-scatters, and their mirrors in the backward); ColwiseParallel and SequenceParallel only
annotate local tensors."""


def _present(model: nn.Module, name: str) -> nn.Module | None:
    """The submodule `name`, or None where a pipeline stage has none (its embedding, norm or head)."""
    parent, _, leaf = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    module = getattr(owner, leaf, None)
    return module if isinstance(module, nn.Module) else None


def communicating(model: nn.Module) -> list[nn.Module]:
    """The modules of a tensor-parallel model that communicate: COMMUNICATING in every layer, the
    embedding and the head (those the model, or its pipeline stage, has)."""
    layers = model.get_submodule("model.layers")
    inside = [layer.get_submodule(name) for layer in layers.children() for name in COMMUNICATING]
    ends = [_present(model, "model.embed_tokens"), _present(model, "lm_head")]
    return [m for m in (ends[0], *inside, ends[1]) if m is not None]


def apply_tp(model: nn.Module, tp: DeviceMesh, cfg: ModelConfig) -> None:
    """Parallelize `model` (a LlamaForCausalLM, LoRA applied or not, best on the meta device) over
    the TP mesh, in place. Frozen parameters stay frozen (SequenceParallel's replicated norm
    weights come back trainable)."""
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    layers = model.get_submodule("model.layers")
    for layer in layers.children():
        plan = block_plan(cfg)
        for name, style in list(plan.items()):
            if isinstance(layer.get_submodule(name), LoRALinear):
                plan[name] = ShardedLoRA(colwise=name in COLWISE)
        parallelize_module(layer, tp, plan)
    parallelize_module(model, tp, {name: style for name, style in root_plan().items() if _present(model, name) is not None})
    if cfg.tie_embeddings and _present(model, "lm_head") is not None \
            and _present(model, "model.embed_tokens") is not None:
        model.get_submodule("lm_head").weight = model.get_submodule("model.embed_tokens").weight
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)


class ShardedLoRA(ParallelStyle):
    """A LoRALinear laid out as its base's style lays out the base: column-parallel (the base and B
    sharded by output rows, A whole; input replicated, output sharded on the features) or
    row-parallel (the base and A sharded by input columns, B whole; input sharded on the features,
    output reduce-scattered along the sequence)."""

    def __init__(self, colwise: bool) -> None:
        super().__init__()
        self.colwise = colwise

    def _placements(self) -> dict[str, Placement]:
        if self.colwise:
            return {"weight": Shard(0), "bias": Shard(0), "lora_A.weight": Replicate(), "lora_B.weight": Shard(0)}
        return {"weight": Shard(1), "bias": Replicate(), "lora_A.weight": Shard(1), "lora_B.weight": Replicate()}

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        if name:  # the adapters' own Linear modules: their weights are placed from the LoRALinear
            return
        placements = self._placements()
        for pname, param in list(module.named_parameters()):
            owner, _, leaf = pname.rpartition(".")
            target = module.get_submodule(owner) if owner else module
            target.register_parameter(leaf, nn.Parameter(distribute_tensor(param, mesh, [placements[pname]]),
                                                         requires_grad=param.requires_grad))

    def _input(self, module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Replicate() if self.colwise else Shard(-1)], run_check=False)
        return (x, *inputs[1:])

    def _output(self, module: nn.Module, output: DTensor, mesh: DeviceMesh) -> Any:
        if not self.colwise:
            output = output.redistribute(mesh, [Shard(1)])
        return output.to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._partition, self._input,  # type: ignore[arg-type]
                                 self._output)  # type: ignore[arg-type]
