"""A checkpoint of the project written out as a Hugging Face model directory, streaming.

Each tensor is read whole from the pieces the ranks saved (only its byte ranges, each chunk checked
against the manifest), converted, and written into its output shard; memory stays within one
output shard (`hf_writer`). The run's config says what the model is (its dimensions, its base
directory, its tokenizer): the export copies the base's files and the tokenizer the run trained with.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.reader import Reader, read_json, saved_tensors
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import Config
from resilient_slurm.export.hf_layout import Shard
from resilient_slurm.export.hf_writer import ExportError, write_hf
from resilient_slurm.workload.chat_data import resolve_path
from resilient_slurm.workload.tokenizer import ChatTokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def export_checkpoint(ckpt: Path, out: Path, cfg: Config, dtype: torch.dtype = torch.bfloat16,
                      io_threads: int = 4) -> list[Shard]:
    """Write checkpoint `ckpt` of a run with config `cfg` to the new directory `out`."""
    verdict = verify(ckpt, checksums=False)
    if not verdict.ok or verdict.manifest is None:
        raise ExportError(f"export: {ckpt} is not a valid checkpoint ({verdict.reason}); pick another with --step")
    manifest = verdict.manifest
    docs = {rel: read_json(ckpt, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    saved = saved_tensors(ckpt, layout.MODEL, manifest, docs)

    def read(name: str) -> torch.Tensor:
        tensor = saved[name]
        dest = torch.empty(tensor.shape, dtype=tensor.dtype)
        reader = Reader(ckpt, manifest, io_threads)
        reader.add(name, tensor, dest, 0)
        reader.run()
        return dest

    tokenizer_dir = resolve_path(cfg.data.tokenizer or cfg.model.pretrained or "")
    model_cfg = cfg.model
    if not model_cfg.eos_token_id and tokenizer_dir:
        # A model initialised here has no config of its own to take the ids from: the tokenizer has them.
        model_cfg = dataclasses.replace(model_cfg, eos_token_id=list(ChatTokenizer(tokenizer_dir).eos_ids))
    return write_hf(str(out), [(name, t.shape) for name, t in saved.items()], read, model_cfg, dtype,
                    tokenizer_dir=tokenizer_dir or None, base_dir=cfg.model.pretrained, max_shard_bytes=5 * 10**9)
