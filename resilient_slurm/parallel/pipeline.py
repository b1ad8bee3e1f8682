"""Pipeline parallelism: this rank's stages of the decoder, sharded, and the schedules that run them
(`torch.distributed.pipelining`).

Each stage is a `LlamaForCausalLM` holding only its layers (`decoder.Part`; stages cut by
`config.parallel.stage_layers`), built on the meta device and prepared like a whole model
(`fsdp.prepare`: LoRA, tensor parallelism, activation checkpointing, compiled blocks, FSDP2 over the
data-parallel mesh, the stage its own root so that the schedule reduces its gradients when its
last backward is done). `view` is one module
over this rank's stages, sharing their submodules: its parameter names are the global ones
(`model.layers.17...`), which the optimizer, the checkpoint and the export use.

Schedules (`schedule`) get `n_microbatches` = the step's gradient-accumulation micro-batches and
`scale_grads=False`: the loss function divides by the global target-token count itself, as the
non-pipelined step does. Token ids go to the first stage as its positional input, labels to the
last as the target; positions and document ids go to every stage as keyword arguments (the
schedules hand the same micro-batch's kwargs to every stage: PipelineStage.forward_one_chunk in
torch 2.13). Stage shapes are inferred by torch at the first step (a forward and a backward of the
first micro-batch, RNG forked, gradients dropped after), so nothing here spells them out.

Tied embeddings (Megatron's embedding group): the first stage holds `model.embed_tokens.weight`
for its lookup, the last a copy under the same name for its head. Both start from the same values
(filled by name), their gradients are summed between the two before every update (`sync_tied`,
one all-reduce per data-parallel and tensor coordinate), and the same update keeps them equal; the
checkpoint holds the name once. The gradient norm counts the copy once (`norm_parameters`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from resilient_slurm.config import ModelConfig
from resilient_slurm.config.parallel import Layout, rank_stages, stage_layers
from resilient_slurm.model.decoder import LlamaForCausalLM, Part
from resilient_slurm.parallel import fsdp
from resilient_slurm.parallel.mesh import ParallelMesh

TIED = "model.embed_tokens.weight"


@dataclass
class Stages:
    """This rank's pipeline stages."""

    modules: list[LlamaForCausalLM]
    """One per stage this rank runs, in stage order."""
    indices: list[int]
    num_stages: int
    view: LlamaForCausalLM
    """One module over `modules`, with the global parameter names."""
    group: dist.ProcessGroup
    """The pipeline group: this rank's data-parallel and tensor coordinate at every stage."""
    tied: dist.ProcessGroup | None
    """The first and the last stage of this coordinate, when the head is the embedding's weight."""
    schedule_name: str
    device: torch.device

    @property
    def first(self) -> bool:
        """This rank runs the first stage: it takes the token ids."""
        return self.indices[0] == 0

    @property
    def last(self) -> bool:
        """This rank runs the last stage: it takes the labels and computes the loss."""
        return self.indices[-1] == self.num_stages - 1

    def schedule(self, n_microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
        """A schedule of `parallel.pp_schedule` over fresh PipelineStage objects (each schedule infers
        its own shapes at its first step)."""
        stages = self._fresh_stages()
        if self.schedule_name == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)
        single = Schedule1F1B if self.schedule_name == "1f1b" else ScheduleGPipe
        return single(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)

    def eval_schedule(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
        """A forward-only schedule of one micro-batch a call (`.eval(...)`), for the validation loss."""
        stages = self._fresh_stages()
        if len(stages) > 1:
            return ScheduleInterleaved1F1B(stages, 1, loss_fn=loss_fn, scale_grads=False)
        return ScheduleGPipe(stages[0], 1, loss_fn=loss_fn, scale_grads=False)

    def _fresh_stages(self) -> list[Any]:
        return [PipelineStage(m, i, self.num_stages, self.device, group=self.group)
                for m, i in zip(self.modules, self.indices)]

    def sync_tied(self) -> None:
        """Sum the tied weight's gradient between its two copies (after the schedule's own
        data-parallel reduction: both hold the same rows of it)."""
        if self.tied is None or not (self.first or self.last):
            return
        grad = self.view.get_parameter(TIED).grad
        if grad is not None:
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.tied)

    def norm_parameters(self) -> list[nn.Parameter]:
        """The trained parameters whose gradients make the global norm, the tied copy of the last
        stage left out (the first stage counts it)."""
        skip = self._tied_copy()
        return [p for name, p in self.view.named_parameters() if p.requires_grad and name != skip]

    def count_parameters(self) -> tuple[int, int]:
        """The whole model's parameters, and those trained: summed over the stages, the tied copy once."""
        skip = self._tied_copy()
        mine = [(p.numel(), p.numel() * p.requires_grad) for name, p in self.view.named_parameters() if name != skip]
        counts = torch.tensor([sum(a for a, _ in mine), sum(b for _, b in mine)], dtype=torch.int64, device=self.device)
        dist.all_reduce(counts, group=self.group)
        return int(counts[0]), int(counts[1])

    def _tied_copy(self) -> str | None:
        """The name of the tied weight's second copy on this rank (the last stage's), if it holds one."""
        return TIED if self.tied is not None and self.last and not self.first else None

    def reshard(self) -> None:
        """Shard every unit's weights again after forwards without a backward (evaluation): units
        keep them gathered after their forward under pipeline parallelism."""
        for m in self.modules:
            for unit in m.modules():
                if isinstance(unit, FSDPModule):
                    unit.reshard()


def build_stages(cfg: ModelConfig, schedule_name: str, stages_per_rank: int, mesh: ParallelMesh,
                 device: torch.device) -> Stages:
    """This rank's stages, sharded and allocated but not yet filled (`fsdp.fill` on `view`)."""
    lay = mesh.layout
    num_stages = lay.pp * stages_per_rank
    cuts = stage_layers(cfg.num_layers, num_stages)
    indices = rank_stages(mesh.position.coords.pp, lay.pp, stages_per_rank)
    modules = []
    for i in indices:
        with torch.device("meta"):
            stage = LlamaForCausalLM(cfg, Part(tuple(cuts[i]), first=i == 0, last=i == num_stages - 1))
        fsdp.prepare(stage, cfg, mesh.dp, mesh.tp, reshard_after_forward=False)
        stage.to_empty(device=device)
        modules.append(stage)
    assert mesh.pp_group is not None
    tied = tied_group(lay, mesh.pp_group) if cfg.tie_embeddings else None
    return Stages(modules, indices, num_stages, view_of(cfg, modules), mesh.pp_group, tied, schedule_name, device)


def view_of(cfg: ModelConfig, modules: list[LlamaForCausalLM]) -> LlamaForCausalLM:
    """One module holding `modules`' submodules (the same objects) under their global names."""
    with torch.device("meta"):
        view = LlamaForCausalLM(cfg, Part((), first=False, last=False))
    for m in modules:
        if m.model.embed_tokens is not None:
            view.model.embed_tokens = m.model.embed_tokens
        for key, layer in m.model.layers.items():
            view.model.layers[key] = layer
        if m.model.norm is not None:
            view.model.norm = m.model.norm
        if m.lm_head is not None:
            view.lm_head = m.lm_head
    return view


def tied_group(lay: Layout, pp_group: dist.ProcessGroup) -> dist.ProcessGroup | None:
    """The group of this rank's first- and last-stage ranks (the same data-parallel and tensor
    coordinate); None on a middle stage. Every rank takes part in making every group."""
    if lay.pp == 2:
        return pp_group
    per_stage = lay.world_size // lay.pp
    mine, _ = dist.new_subgroups_by_enumeration(
        [[i, (lay.pp - 1) * per_stage + i] for i in range(per_stage)])
    return mine
