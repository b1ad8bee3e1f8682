"""The data a run trains on, opened for one rank: chat rows or a token mixture, with its sampler.

The built-in trainer opens its data here; bad input stops before any training with one line naming
the file and the fix (an `InputError`).
"""

from __future__ import annotations

import json
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.data.chat.dataset import ChatData, cache_root, open_chat_data
from resilient_slurm.data.fingerprint import DataFingerprint, fingerprint
from resilient_slurm.data.pipeline import ChatPipeline, TokenPipeline
from resilient_slurm.data.tokens.token_data import open_token_data
from resilient_slurm.errors import InputError
from resilient_slurm.files import atomic_write
from resilient_slurm.rundir import RunDir
from resilient_slurm.session.distributed import Comm


def open_pipeline(cfg: Config, run_dir: Path, comm: Comm, dp_rank: int, dp_size: int) -> ChatPipeline | TokenPipeline:
    """The run's data and its sampler for this rank: chat rows, or a token mixture (data.kind=tokens).
    The sampler hands out the rows of data-parallel group `dp_rank` of `dp_size`: the tensor and
    pipeline ranks of one group read the same rows, so a layout change does not change the data."""
    if cfg.data.kind == "tokens":
        return TokenPipeline(cfg, open_token_data(cfg, run_dir, comm.rank), dp_rank, dp_size)
    return ChatPipeline(cfg, open_data(cfg, run_dir, comm), dp_rank, dp_size)


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

    data = open_chat_data(cfg.data, tokenizer, cache_root(cfg), recorded, take=take)
    if data.tokenizer.vocab_size > cfg.model.vocab_size:
        raise InputError(f"vocabulary mismatch: the tokenizer of {tokenizer} has {data.tokenizer.vocab_size} tokens "
                         f"but the model embeds {cfg.model.vocab_size} (model.vocab_size); use the model's own "
                         f"tokenizer, or a model whose vocabulary covers it")
    if comm.rank == 0 and recorded is None:
        atomic_write(record, json.dumps(data.fingerprint.to_record(), indent=1) + "\n")
    return data
