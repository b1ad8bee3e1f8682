"""What a rank builds before its first step: the data, and the sharded model with its initial weights.

Bad input stops the run before any training, with one line naming the file and the fix
(`InputError`; the job exits with ExitCode.CONFIG, which no restart retries): a malformed chat line,
a tokenizer without a chat template, data changed since the run started, a model that is not a
Llama, a missing shard of its weights, a tokenizer whose vocabulary the model cannot embed; for a
LoRA run, a checkpoint of another base model or of a full fine-tune (`resume_refusal`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm.checkpoint.dcp_io import fill_model
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.parallel import fsdp
from resilient_slurm.parallel.pipeline import Stages, build_stages
from resilient_slurm.errors import InputError
from resilient_slurm.session.distributed import Comm
from resilient_slurm.parallel.mesh import ParallelMesh
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.model.pretrained import HFWeights, expected_shapes, identity


def build_model(cfg: Config, comm: Comm, mesh: ParallelMesh | None = None) -> LlamaForCausalLM:
    """The model laid out over the run's mesh (None: FSDP2 over every rank), with its initial weights."""
    if mesh is None:
        model = fsdp.build_model(cfg.model, comm.mesh, comm.device)
    else:
        model = fsdp.build_model(cfg.model, mesh.dp, comm.device, tp=mesh.tp)
    fill_initial(model, cfg)
    return model


def build_pipeline(cfg: Config, comm: Comm, mesh: ParallelMesh) -> Stages:
    """This rank's pipeline stages (parallel.pp > 1), with their initial weights: a tied head's copy
    on the last stage gets the embedding's, filled by the same name."""
    stages = build_stages(cfg.model, cfg.parallel.pp_schedule, cfg.parallel.stages_per_rank, mesh, comm.device)
    fill_initial(stages.view, cfg)
    return stages


def fill_initial(model: nn.Module, cfg: Config) -> None:
    """(Re)write this rank's shards with the initial weights: the pretrained ones, read box by box
    (the box's rows) from their files, a DCP directory's (`model.dcp`, read at this run's sharding),
    or the seeded random ones; LoRA adapters from their seed."""
    if cfg.model.dcp:
        fill_model(model, Path(cfg.model.dcp), cfg.model.num_heads, cfg.model.num_kv_heads)
        return
    if not cfg.model.pretrained:
        fsdp.fill_random(model, cfg.model, cfg.train.seed)
        return
    weights = HFWeights(cfg.model.pretrained)
    weights.check(expected_shapes(cfg.model))

    def box_of(name: str, shape: tuple[int, ...], offset: tuple[int, ...], out: torch.Tensor) -> None:
        if out.device.type == "cpu":
            weights.read_box(name, offset, out)
        else:  # the file's bytes land in host memory first
            host = torch.empty(out.shape, dtype=out.dtype)
            weights.read_box(name, offset, host)
            out.copy_(host)

    fsdp.fill(model, fsdp.with_adapters(box_of, cfg.train.seed))


def base_model(cfg: Config) -> dict[str, Any] | None:
    """What a LoRA run's frozen weights are, as its checkpoints record it: the pretrained
    directory and its identity (a hash of its index and files), or the random initialisation's
    seed. None for a full fine-tune, whose checkpoints hold every weight."""
    if cfg.model.lora.rank is None:
        return None
    if not cfg.model.pretrained:
        return {"path": None, "identity": f"random-init:seed={cfg.train.seed}:std={cfg.model.init_std}"}
    return {"path": cfg.model.pretrained, "identity": identity(cfg.model.pretrained)}


def lora_stamp(cfg: Config, base: dict[str, Any] | None) -> dict[str, Any]:
    """What every checkpoint of a LoRA run records of it: its adapters (rank, alpha, dropout,
    targets) and its base model (`base_model`); nothing for a full fine-tune."""
    lora = cfg.model.lora
    if lora.rank is None:
        return {}
    return {"lora": {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout, "targets": list(lora.targets)},
            "base_model": base}


def resume_refusal(train_state: TrainState, cfg: Config, base: dict[str, Any] | None) -> str | None:
    """Why this run must not continue from a checkpoint with `train_state` (None: it may). Not a
    damaged checkpoint to skip: the next one would be refused alike, and falling back to a fresh
    start would silently discard the run, so the resume stops with this line instead."""
    saved_lora, saved_base = train_state.lora, train_state.base_model
    rank = cfg.model.lora.rank
    if rank is not None and saved_lora is None:
        return (f"a checkpoint of a full fine-tune, and this run trains LoRA adapters (model.lora.rank={rank}); "
                f"resume it without model.lora.rank, or start a new run (another run.name)")
    if rank is None and saved_lora is not None:
        return (f"a checkpoint of LoRA adapters (rank {saved_lora['rank']}) without their base weights, and this "
                f"run is a full fine-tune; resume it with model.lora.rank={saved_lora['rank']}, or start a new run")
    if base is not None and saved_base is not None and saved_base["identity"] != base["identity"]:
        return (f"its adapters were trained on the base model {saved_base['path'] or 'of random weights'} "
                f"(identity {saved_base['identity'][:16]}), but this run's base {base['path'] or 'is random'} has "
                f"identity {base['identity'][:16]}; restore that base model (model.pretrained), or start a new run")
    return None
