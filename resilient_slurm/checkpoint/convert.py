"""A checkpoint of ours to a torch.distributed.checkpoint (DCP) directory and back, without a
process group (`python -m resilient_slurm.checkpoint convert`).

What moves is the model's weights, which is what moves between frameworks; optimizer state, RNG
states and the data position belong to a run and stay in its own checkpoints. Chunks keep their
boxes both ways (DCP's metadata then lists the chunks the ranks saved), except `wq`/`wk` under
torchtitan's names, whose rows are permuted within each head (`names.py`): those are converted
whole. Each chunk is read when it is written, so memory holds one chunk (DCP out) or one output
file (ours out) at a time; every byte read from our side is checked against its CRC.

A checkpoint written here is a step directory like a run's (manifest last, after every file is
durable; `verify` accepts it) with step 0 unless its directory is named `step_N`, and no optimizer
state: a run resumes from it with fresh AdamW moments, or a run starts from the DCP directory
itself with `model.dcp`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from resilient_slurm.checkpoint import dcp_io, layout, names, store
from resilient_slurm.checkpoint.chunks import Box, tiling_gap, whole
from resilient_slurm.checkpoint.manifest import FileEntry, Manifest
from resilient_slurm.checkpoint.parallel_io import write_files
from resilient_slurm.checkpoint.reader import Reader, read_json, saved_tensors
from resilient_slurm.checkpoint.safetensors_io import DTYPE_NAMES, out_file, write_bytes
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.verify import check_files, verify
from resilient_slurm.errors import InputError
from resilient_slurm.files import utc_stamp
from resilient_slurm.rundir import RunDir

SKIPPED = ("optimizer.", "optim.", "lr_scheduler.", "scheduler.", "dataloader.", "train_state.")
"""DCP keys of a training state that are not the model's (torchtitan's checkpointer's, and the
`{"model": ..., "optim": ...}` a loop saves): left behind, and counted."""


class ConvertError(InputError):
    """The conversion cannot be done as asked; the message names the thing and the fix."""


@dataclass(frozen=True)
class Heads:
    """Attention heads of the model: the rotary permutation of wq and wk needs them."""

    query: int
    kv: int


@dataclass(frozen=True)
class Converted:
    source: Path
    tensors: int
    chunks: int
    nbytes: int
    skipped: int
    """Tensors of the source that are not the model's, left behind."""


def checkpoint_of(src: Path) -> Path:
    """A step directory as it is; a run directory's newest checkpoint that verifies."""
    if not RunDir(src).exists():
        return src
    for _, path in store.list_step_dirs(RunDir(src).checkpoints):
        if verify(path, checksums=False).ok:
            return path
    raise ConvertError(f"convert: run {src} has no valid checkpoint yet; convert a step directory, or a run that saved")


def to_dcp(src: Path, dst: Path, naming: str, heads: Heads | None, io_threads: int = 4) -> Converted:
    ckpt = checkpoint_of(src)
    verdict = verify(ckpt, checksums=False)
    if not verdict.ok or verdict.manifest is None:
        raise ConvertError(f"convert: {ckpt} is not a valid checkpoint ({verdict.reason}); pick another step directory")
    _fresh(dst)
    manifest = verdict.manifest
    docs = {rel: read_json(ckpt, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    every = saved_tensors(ckpt, layout.MODEL, manifest, docs)

    def read(name: str, box: Box) -> torch.Tensor:
        dest = torch.empty(box.lengths, dtype=every[name].dtype)
        reader = Reader(ckpt, manifest, io_threads)
        reader.add(name, every[name], dest, box)
        reader.run()
        return dest

    items: list[tuple[str, tuple[int, ...], torch.dtype, Box, dcp_io.Source]] = []
    for name, saved in every.items():
        key = names.rename(name, naming, to_ours=False)
        if key is None:
            raise ConvertError(f"convert: {name} has no torchtitan Llama-3 name (its Llama has no such tensor); "
                               f"convert with --names hf")
        kind = names.rotary(name) if naming == "torchtitan" else None
        if kind is not None:
            permuted = partial(_to_torchtitan, read, name, whole(saved.shape), _head_dim(name, saved.shape, kind, heads))
            items.append((key, saved.shape, saved.dtype, whole(saved.shape), permuted))
        else:
            items += [(key, saved.shape, saved.dtype, box, partial(read, name, box)) for _, box in saved.chunks]
    dcp_io.write_chunks(dst, items, threads=io_threads)
    return Converted(ckpt, len({i[0] for i in items}), len(items), sum(i[3].volume * i[2].itemsize for i in items), 0)


def to_native(src: Path, dst: Path, naming: str | None, heads: Heads | None, max_shard_bytes: int = 1 << 30,
              io_threads: int = 4, prefix: str | None = None) -> Converted:
    """`prefix`: the model's tensors are the keys under it (any model); None: a Llama's, found by
    their embedding's name (`dcp_io.model_keys`)."""
    found = dcp_io.tensors(src)
    if prefix is None:
        naming, prefix = dcp_io.model_keys(src, found, naming)
    naming = naming or "hf"
    _fresh(dst)
    model: dict[str, tuple[str, dcp_io.DcpTensor]] = {}
    skipped = 0
    for key, t in sorted(found.items()):
        rest = key[len(prefix):] if key.startswith(prefix) else None
        if rest is None or key.startswith(SKIPPED):
            skipped += 1
            continue
        ours = names.rename(rest, naming, to_ours=True)
        if ours is None:
            raise ConvertError(f"convert: {src}: tensor {key!r} is not one of torchtitan's Llama-3 tensors; convert "
                               f"with --names hf to keep every tensor under its own name")
        gap = tiling_gap(t.shape, list(t.chunks))
        if gap:
            raise dcp_io.incomplete(src, key, gap)
        model[ours] = (key, t)
    # (our name, its key, the tensor, the boxes we write): DCP's chunks, or the whole of a permuted one.
    plan = [(ours, key, t, [whole(t.shape)] if naming == "torchtitan" and names.rotary(ours) else list(t.chunks))
            for ours, (key, t) in model.items()]
    files = _files([(ours, t, box) for ours, _, t, boxes in plan for box in boxes], max_shard_bytes)
    tmp = dst.parent / f"{layout.TMP_PREFIX}{dst.name}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / layout.RNG_DIR).mkdir(parents=True)
    entries: dict[str, FileEntry] = {}
    keys = {ours: (key, t) for ours, key, t, _ in plan}
    for filename, chunks in files:
        tensors = []
        for ours, box in chunks:
            key, t = keys[ours]
            kind = names.rotary(ours) if naming == "torchtitan" else None
            dest = torch.empty(box.lengths, dtype=t.dtype)
            dcp_io.read_boxes(src, found, [(key, box, dest)])
            if kind is not None:
                dest = dcp_io.rotary_to_hf(dest, _head_dim(ours, t.shape, kind, heads))
            tensors.append((ours, dest))
        digest = write_files([out_file(str(tmp / filename), tensors)], io_threads)[0]
        entries[filename] = FileEntry(digest.nbytes, digest.crc32, digest.chunks)
    specs = [layout.TensorSpec(ours, t.shape, DTYPE_NAMES[t.dtype], t.dtype.itemsize) for ours, _, t, _ in plan]
    chunk_files = [layout.ChunkFile(f, 0, tuple(layout.Chunk(n, b) for n, b in c)) for f, c in files]
    step = layout.parse_step_dir(dst.name) or 0
    blobs = {layout.shards_file(layout.MODEL): layout.shards_index(specs, chunk_files),
             layout.TRAIN_STATE: TrainState(step=step, reason=f"converted from DCP {src}", saved_at=utc_stamp()).to_json()}
    for rel, body in blobs.items():
        d = write_bytes(str(tmp / rel), _json(body))
        entries[rel] = FileEntry(d.nbytes, d.crc32, d.chunks)
    manifest = Manifest(step=step, world_size=1, files=entries, created=utc_stamp())
    problem = check_files(tmp, manifest, checksums=False)
    if problem:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"convert: the files written fail verification: {problem}")
    store.fsync_path(tmp / layout.RNG_DIR)
    write_bytes(str(tmp / layout.MANIFEST), manifest.to_json())
    store.fsync_path(tmp)
    os.rename(tmp, dst)
    store.fsync_path(dst.parent)
    return Converted(src, len(plan), sum(len(c) for _, c in files),
                     sum(b.volume * t.dtype.itemsize for _, _, t, boxes in plan for b in boxes), skipped)


def _to_torchtitan(read: Callable[[str, Box], torch.Tensor], name: str, box: Box, head_dim: int) -> torch.Tensor:
    return dcp_io.rotary_to_torchtitan(read(name, box), head_dim)


def _files(chunks: list[tuple[str, dcp_io.DcpTensor, Box]], max_shard_bytes: int) -> list[tuple[str, list[tuple[str, Box]]]]:
    """Chunks in order, cut into files of at most `max_shard_bytes` (a larger chunk gets one of its
    own); a file holds one chunk of a tensor at most (its safetensors entry is named after it)."""
    runs: list[list[tuple[str, Box]]] = []
    size = 0
    for name, t, box in chunks:
        nbytes = box.volume * t.dtype.itemsize
        if not runs or (runs[-1] and size + nbytes > max_shard_bytes) or any(n == name for n, _ in runs[-1]):
            runs.append([])
            size = 0
        runs[-1].append((name, box))
        size += nbytes
    if len(runs) == 1:
        return [(f"{layout.MODEL}.safetensors", runs[0])]
    return [(f"{layout.MODEL}-{i + 1:05d}-of-{len(runs):05d}.safetensors", run) for i, run in enumerate(runs)]


def _head_dim(name: str, shape: tuple[int, ...], kind: str, heads: Heads | None) -> int:
    if heads is None:
        raise ConvertError(f"convert: {name} is permuted between torchtitan's rotary layout and ours, which needs the "
                           f"model's head counts: pass --heads N --kv-heads M")
    count = heads.query if kind == "q" else heads.kv
    if count < 1 or shape[0] % count or (shape[0] // count) % 2:
        raise ConvertError(f"convert: {name} has {shape[0]} rows, which {count} heads of an even size do not divide; "
                           f"check --heads and --kv-heads")
    return shape[0] // count


def _fresh(dst: Path) -> None:
    if dst.exists() and any(dst.iterdir()):
        raise ConvertError(f"convert: {dst} exists and is not empty; choose a new directory")


def _json(body: object) -> bytes:
    return json.dumps(body, indent=1, sort_keys=True).encode()
