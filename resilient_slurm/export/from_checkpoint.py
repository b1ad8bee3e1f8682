"""A checkpoint of the project written out for its users, streaming: a Hugging Face model directory,
or for a LoRA run a PEFT adapter directory (or, with `merge`, the model with its adapters merged in).

Each tensor is read whole from the chunks the ranks saved (only its byte ranges, each chunk checked
against the manifest), converted, and written; memory stays within one output shard (`hf_writer`).
The run's config says what the model is (its dimensions, its base directory, its tokenizer): the
export copies the base's files and the tokenizer the run trained with. A merge reads the base model
too, and refuses a base whose identity differs from the one the adapters were trained on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.chunks import whole
from resilient_slurm.checkpoint.reader import Reader, read_json, saved_tensors
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import Config
from resilient_slurm.console import progress
from resilient_slurm.export.adapters import merged_reader, write_adapter
from resilient_slurm.export.hf_writer import DTYPE_NAMES, ExportError, write_hf
from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.model.pretrained import PretrainedError, expected_shapes, identity
from resilient_slurm.data.tokenizer import ChatTokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class Written:
    format: str
    """hf: a whole model (transformers, vLLM); peft: a LoRA adapter (peft, vLLM --lora-modules)."""
    dtype: str
    files: int
    """Weight files written."""


def export_checkpoint(ckpt: Path, out: Path, cfg: Config, dtype: torch.dtype | None = None,
                      io_threads: int = 4, merge: bool = False) -> Written:
    """Write checkpoint `ckpt` of a run with config `cfg` to the new directory `out`. `dtype`: of the
    weights written (default bfloat16 for a model, float32 for an adapter, as peft saves them)."""
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
        reader.add(name, tensor, dest, whole(tensor.shape))
        reader.run()
        return dest

    tokenizer_dir = resolve_path(cfg.data.tokenizer or cfg.model.pretrained or "") or None
    lora = cfg.model.lora.rank is not None
    if merge and not lora:
        raise ExportError(f"export: {ckpt} is a full fine-tune's checkpoint, with no adapters to merge; "
                          f"export it without --merge")
    if lora and not merge:
        dtype = dtype or torch.float32
        write_adapter(str(out), list(saved), read, cfg, dtype, tokenizer_dir)
        return Written("peft", DTYPE_NAMES[dtype], 1)
    dtype = dtype or torch.bfloat16
    model_cfg = cfg.model
    if not model_cfg.eos_token_id and tokenizer_dir:
        # A model initialised here has no config of its own to take the ids from: the tokenizer has them.
        model_cfg = dataclasses.replace(model_cfg, eos_token_id=list(ChatTokenizer(tokenizer_dir).eos_ids))
    tensors: list[tuple[str, tuple[int, ...]]] = [(name, t.shape) for name, t in saved.items()]
    source: Callable[[str], torch.Tensor] = read
    if merge:
        _check_base(TrainState.from_json(docs[layout.TRAIN_STATE]), cfg, ckpt)
        shapes = expected_shapes(cfg.model)
        tensors = list(shapes.items())
        source = merged_reader(cfg, list(saved), read, shapes)
    with progress(len(tensors), f"exporting {ckpt.name}", unit="tensor") as bar:
        def counted(name: str) -> torch.Tensor:
            tensor = source(name)
            bar.update()
            return tensor

        shards = write_hf(str(out), tensors, counted, model_cfg, dtype, tokenizer_dir=tokenizer_dir,
                          base_dir=cfg.model.pretrained, max_shard_bytes=5 * 10**9)
    return Written("hf", DTYPE_NAMES[dtype], len(shards))


def _check_base(train_state: TrainState, cfg: Config, ckpt: Path) -> None:
    """The adapters fold into the base they were trained on, or not at all."""
    recorded = train_state.base_model
    if recorded is None or not cfg.model.pretrained:
        return  # a random base is rebuilt from the run's seed, which the config fixes
    try:
        now = identity(cfg.model.pretrained)
    except PretrainedError as e:
        raise ExportError(f"export: the base model is needed to merge the adapters: {e}") from None
    if now != recorded["identity"]:
        raise ExportError(f"export: {ckpt}'s adapters were trained on the base model {recorded['path']} "
                          f"(identity {str(recorded['identity'])[:16]}), but {cfg.model.pretrained} is now "
                          f"{now[:16]}; restore that base model to merge, or export the adapter without --merge")
