"""What a rank builds before its first step: the data, and the sharded model with its initial weights.

Bad input stops the run before any training, with one line naming the file and the fix
(`InputError`; the job exits with ExitCode.CONFIG, which no restart retries): a malformed chat line,
a tokenizer without a chat template, data changed since the run started, a model that is not a
Llama, a missing shard of its weights, a tokenizer whose vocabulary the model cannot embed; for a
LoRA run, a checkpoint of another base model or of a full fine-tune (`resume_refusal`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm.files import atomic_write
from resilient_slurm.rundir import RunDir
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.model import parallel
from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.token_data import open_token_data
from resilient_slurm.runtime.pipeline import ChatPipeline, TokenPipeline
from resilient_slurm.runtime.session import InputError
from resilient_slurm.runtime.distributed import Comm
from resilient_slurm.data.chat.build import DataFormatError
from resilient_slurm.data.fingerprint import DataChangedError, DataFingerprint, fingerprint
from resilient_slurm.data.chat.dataset import ChatData, cache_root, open_chat_data
from resilient_slurm.data.chat_template import TemplateRenderError
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.model.pretrained import HFWeights, PretrainedError, expected_shapes, identity
from resilient_slurm.data.tokenizer import TokenizerError

INPUT_ERRORS = (DataFormatError, DataChangedError, TemplateRenderError, TokenizerError, PretrainedError,
                FileNotFoundError)


def open_pipeline(cfg: Config, run_dir: Path, comm: Comm) -> ChatPipeline | TokenPipeline:
    """The run's data and its sampler for this rank: chat rows, or a token mixture (data.kind=tokens)."""
    if cfg.data.kind == "tokens":
        try:
            tokens = open_token_data(cfg, run_dir, comm.rank)
        except TokenDataError as e:
            raise InputError(str(e)) from None
        return TokenPipeline(cfg, tokens, comm.rank, comm.world_size)
    return ChatPipeline(cfg, open_data(cfg, run_dir, comm), comm.rank, comm.world_size)


def open_data(cfg: Config, run_dir: Path, comm: Comm) -> ChatData:
    """The run's chat data, tokenized once (rank 0 of a node builds the cache entry, the others
    wait). The first start records the data's fingerprint; a later start against changed data is
    refused, naming the file."""
    record = RunDir(run_dir).data_record
    recorded = json.loads(record.read_text()) if record.exists() else None
    tokenizer = cfg.data.tokenizer or cfg.model.pretrained or ""

    def take(files: list[str]) -> DataFingerprint:
        # One rank reads the samples; every rank gets the same fingerprint (the others' disks may be slow).
        return comm.all_gather_object(fingerprint(files) if comm.rank == 0 else None)[0]

    try:
        data = open_chat_data(cfg.data, tokenizer, cache_root(cfg), recorded, take=take)
    except INPUT_ERRORS as e:
        raise InputError(str(e)) from None
    if data.tokenizer.vocab_size > cfg.model.vocab_size:
        raise InputError(f"vocabulary mismatch: the tokenizer of {tokenizer} has {data.tokenizer.vocab_size} tokens "
                         f"but the model embeds {cfg.model.vocab_size} (model.vocab_size); use the model's own "
                         f"tokenizer, or a model whose vocabulary covers it")
    if comm.rank == 0 and recorded is None:
        atomic_write(record, json.dumps(data.fingerprint.to_record(), indent=1) + "\n")
    return data


def build_model(cfg: Config, comm: Comm) -> LlamaForCausalLM:
    """The model sharded over the run's ranks, with its initial weights."""
    model = parallel.build_model(cfg.model, comm.mesh, comm.device)
    fill_initial(model, cfg)
    return model


def fill_initial(model: nn.Module, cfg: Config) -> None:
    """(Re)write this rank's shards with the initial weights: the pretrained ones, read row range
    by row range from their files, or the seeded random ones; LoRA adapters from their seed."""
    if not cfg.model.pretrained:
        parallel.fill_random(model, cfg.model, cfg.train.seed)
        return
    try:
        weights = HFWeights(cfg.model.pretrained)
        weights.check(expected_shapes(cfg.model))
    except INPUT_ERRORS as e:
        raise InputError(str(e)) from None

    def rows_of(name: str, shape: tuple[int, ...], start: int, stop: int, out: torch.Tensor) -> None:
        if out.device.type == "cpu":
            weights.read_rows(name, start, stop, out)
        else:  # the file's bytes land in host memory first
            host = torch.empty(out.shape, dtype=out.dtype)
            weights.read_rows(name, start, stop, host)
            out.copy_(host)

    parallel.fill(model, parallel.with_adapters(rows_of, cfg.train.seed))


def base_model(cfg: Config) -> dict[str, Any] | None:
    """What a LoRA run's frozen weights are, as its checkpoints record it: the pretrained
    directory and its identity (a hash of its index and files), or the random initialisation's
    seed. None for a full fine-tune, whose checkpoints hold every weight."""
    if cfg.model.lora.rank is None:
        return None
    if not cfg.model.pretrained:
        return {"path": None, "identity": f"random-init:seed={cfg.train.seed}:std={cfg.model.init_std}"}
    try:
        return {"path": cfg.model.pretrained, "identity": identity(cfg.model.pretrained)}
    except INPUT_ERRORS as e:
        raise InputError(str(e)) from None


def lora_record(cfg: Config) -> dict[str, Any] | None:
    """A LoRA run's adapters as its checkpoints record them; None for a full fine-tune."""
    lora = cfg.model.lora
    if lora.rank is None:
        return None
    return {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout, "targets": list(lora.targets)}


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
