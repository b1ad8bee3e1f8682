"""Write a Hugging Face model directory that `transformers` and vLLM load, one output shard at a time.

The shards are planned from the shapes alone; then, shard by shard, each tensor is read (the full
float32 tensor), converted to the export dtype and written, and the shard is freed before the next
is read, so memory stays within one output shard (5 GB by default) plus the one tensor being
converted. Everything is written into `<out_dir>.tmp` and renamed into place last: a crash or an
error leaves no `out_dir`, never a half-export that looks complete (a stale `.tmp` is replaced by the
next export).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from resilient_slurm.checkpoint.safetensors_io import write_bytes, write_file
from resilient_slurm.checkpoint.store import fsync_path
from resilient_slurm.config import ModelConfig
from resilient_slurm.export.hf_layout import (
    INDEX_FILE,
    SAFETENSORS_METADATA,
    Shard,
    config_from_base,
    copied,
    generation_config,
    index,
    model_config,
    plan_shards,
)
from resilient_slurm.model.pretrained import expected_shapes, model_fields
from resilient_slurm.data.tokenizer import TOKENIZER_FILES
from resilient_slurm.errors import InputError

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Fields that fix the weights' shapes and meaning: an export over a base must agree with it on each.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "tie_embeddings", "family", "qkv_bias", "qk_norm")


class ExportError(InputError):
    """The export cannot be written as asked; the message is one line naming what and the fix."""


def write_hf(out_dir: str, tensors: Sequence[tuple[str, Sequence[int]]], read: Callable[[str], torch.Tensor],
             model_cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, tokenizer_dir: str | None = None,
             base_dir: str | None = None, max_shard_bytes: int = 5 * 10**9) -> list[Shard]:
    """Write the model whose parameters are `tensors` (name, shape) to `out_dir`, a new directory.

    `read(name)` returns that parameter's full value (any float dtype; it is converted to `dtype`).
    config.json is the base directory's with only the dtype changed when `base_dir` is given, else
    built from `model_cfg`. Every non-weight file of the base is copied (tokenizer, chat template,
    generation config, README, LICENSE); then `tokenizer_dir`'s tokenizer files, when it is another
    directory, replace the base's (the run tokenized with them). Returns the shards written."""
    if dtype not in DTYPE_NAMES:
        raise ExportError(f"export: dtype {dtype} is not supported; use one of {', '.join(DTYPE_NAMES.values())}")
    base_config = _base_config(base_dir, model_cfg) if base_dir else None
    shapes = _checked_shapes(tensors, model_cfg)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    shards = plan_shards([(name, math.prod(shape) * itemsize) for name, shape in shapes], max_shard_bytes)
    with staged_directory(out_dir) as tmp:
        planned = dict(shapes)
        for shard in shards:
            _write_shard(os.path.join(tmp, shard.file), shard, planned, read, dtype)
        if len(shards) > 1:
            write_json(tmp, INDEX_FILE, index(shards))
        dtype_name = DTYPE_NAMES[dtype]
        config = config_from_base(base_config, dtype_name) if base_config else model_config(model_cfg, dtype_name)
        write_json(tmp, "config.json", config)
        if base_dir:
            _copy_base_files(base_dir, tmp)
        copy_tokenizer(tokenizer_dir, base_dir, tmp)
        if not os.path.exists(os.path.join(tmp, "generation_config.json")):
            write_json(tmp, "generation_config.json", generation_config(model_cfg))
    return shards


@contextmanager
def staged_directory(out_dir: str) -> Iterator[str]:
    """Yield `<out_dir>.tmp` to write into; renamed to `out_dir` (synced) when the block ends, removed
    when it raises."""
    if os.path.exists(out_dir):
        raise ExportError(f"export: {out_dir} already exists; remove it or choose another output directory")
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        fsync_path(tmp)
        os.rename(tmp, out_dir)
        fsync_path(os.path.dirname(os.path.abspath(out_dir)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_tokenizer(tokenizer_dir: str | None, base_dir: str | None, out: str) -> None:
    """The tokenizer files the run tokenized with, when they are not the base directory's own."""
    if tokenizer_dir and not (base_dir and os.path.samefile(tokenizer_dir, base_dir)):
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(tokenizer_dir, name)):
                _copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))


def write_json(directory: str, name: str, data: dict[str, Any]) -> None:
    write_bytes(os.path.join(directory, name), (json.dumps(data, indent=2) + "\n").encode())


def _checked_shapes(tensors: Sequence[tuple[str, Sequence[int]]],
                    cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors to write, in order (a tied lm_head left out: it is the embedding), each checked
    against the model config, so that what is written is a model transformers can load."""
    expected = expected_shapes(cfg)
    out = [(name, tuple(shape)) for name, shape in tensors if not (cfg.tie_embeddings and name == "lm_head.weight")]
    for name, shape in out:
        if name not in expected:
            raise ExportError(f"export: tensor {name} is not a parameter of a {cfg.family} model with this config")
        if shape != expected[name]:
            raise ExportError(f"export: tensor {name} has shape {list(shape)} but the model config gives "
                              f"{list(expected[name])}")
    missing = sorted(set(expected) - {name for name, _ in out})
    if missing:
        raise ExportError(f"export: no tensor {missing[0]} (of {len(missing)} missing); the export would not load")
    return out


def _base_config(base_dir: str, cfg: ModelConfig) -> dict[str, Any]:
    path = os.path.join(base_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        base: dict[str, Any] = json.load(f)
    fields = model_fields(base, base_dir)
    for key in SHAPE_FIELDS:
        if fields[key] != getattr(cfg, key):
            raise ExportError(f"export: the base model {base_dir} has {key} {fields[key]} but the model has "
                              f"{getattr(cfg, key)}; export without the base directory")
    return base


def _write_shard(path: str, shard: Shard, shapes: dict[str, tuple[int, ...]], read: Callable[[str], torch.Tensor],
                 dtype: torch.dtype) -> None:
    tensors: list[tuple[str, torch.Tensor]] = []
    for name in shard.names:
        value = read(name)
        if tuple(value.shape) != shapes[name]:
            raise ExportError(f"export: read({name!r}) returned shape {list(value.shape)}, "
                              f"expected {list(shapes[name])}")
        tensors.append((name, value.detach().to("cpu", dtype).contiguous()))
        del value  # the float32 original goes now; only the converted shard stays
    write_file(path, tensors, SAFETENSORS_METADATA)


def _copy_base_files(base_dir: str, out: str) -> None:
    for root, dirs, files in os.walk(base_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .cache/, .git/: not the model's
        for name in sorted(files):
            relative = os.path.relpath(os.path.join(root, name), base_dir).replace(os.sep, "/")
            if copied(relative):
                target = os.path.join(out, *relative.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                _copy(os.path.join(root, name), target)


def _copy(src: str, dst: str) -> None:
    """Copy the file's bytes (following a symlink, as in a Hub cache snapshot) and fsync them."""
    shutil.copyfile(src, dst)
    fsync_path(dst)
