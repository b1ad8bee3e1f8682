"""Checkpoint layout: directory and file names, and what a shards index says. Pure.

    checkpoints/
      step_00000100/
        model.safetensors                       or model-0000i-of-0000N.safetensors: the chunks each
                                                rank writes (one safetensors entry per chunk)
        model.shards.json                       every tensor's global shape and dtype, and its chunks:
                                                which box of it (offsets, lengths) each file holds
        optimizer.safetensors                   or shards, + optimizer.shards.json
        optimizer.json                          param groups (hyper-parameters, parameter names)
        scheduler.json                          LR scheduler state
        train_state.json                        step, data position, tokens, run id, config hash, reason
        rng/rank-00000.json                     python, numpy, torch (and CUDA) RNG states of each rank
        manifest.json                           sizes and CRC32 of every file: the commit marker, written last
      .tmp.step_00000200/                       a save in progress; never read, removed on the next start
      .pins/step_00000100.<holder>              retention keeps step 100 while this file exists (a PBT copy)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from resilient_slurm.checkpoint.chunks import Box

FORMAT_NAME = "resilient_slurm-checkpoint"
FORMAT_VERSION = 3
"""3: each tensor as N-dimensional chunks (boxes: offsets and lengths per dimension), whatever the
placements that cut it. 2: pieces of rows (dim 0 only) and per-chunk CRCs in the manifest. 1: whole
tensors, HF-style `<prefix>.safetensors.index.json`. All three load."""
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
SCHEDULER = "scheduler.json"
OPTIMIZER_META = "optimizer.json"
RNG_DIR = "rng"
TMP_PREFIX = ".tmp."
QUARANTINE_DIR = ".quarantine"
PINS_DIR = ".pins"
MODEL = "model"
OPTIMIZER = "optimizer"

_STEP_DIR = re.compile(r"^step_(\d{8,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f"{TMP_PREFIX}{step_dir_name(step)}"


def parse_step_dir(name: str) -> int | None:
    """The step of a committed-looking directory name, or None for anything else."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank-{rank:05d}.json"


def index_file(prefix: str) -> str:
    """Version 1's HF-style index (name -> file)."""
    return f"{prefix}.safetensors.index.json"


def shards_file(prefix: str) -> str:
    return f"{prefix}.shards.json"


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of dim 0 that `rank` of `world` holds of a tensor with `rows` rows: FSDP2's
    Shard(0), chunks of ceil(rows / world) rows, the last ones shorter or empty."""
    chunk = -(-rows // world) if rows else 0
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)




@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the state as a whole, whoever holds which part of it."""

    name: str
    shape: tuple[int, ...]
    """Global shape."""
    dtype: str
    """safetensors dtype name (F32, BF16, I64, ...)."""
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.volume * self.itemsize

    @property
    def volume(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Chunk:
    name: str
    box: Box


@dataclass(frozen=True)
class ChunkFile:
    filename: str
    rank: int
    """The rank that writes it."""
    chunks: tuple[Chunk, ...]


def shards_index(specs: list[TensorSpec], files: list[ChunkFile]) -> dict:
    """`<prefix>.shards.json`: every tensor's shape and dtype, and its chunks [file, offsets, lengths]."""
    chunks: dict[str, list[list]] = {s.name: [] for s in specs}
    for f in files:
        for c in f.chunks:
            chunks[c.name].append([f.filename, list(c.box.offsets), list(c.box.lengths)])
    return {"tensors": {s.name: {"shape": list(s.shape), "dtype": s.dtype, "chunks": chunks[s.name]}
                        for s in specs}}


def index_chunks(entry: dict) -> list[tuple[str, Box]]:
    """The chunks of one tensor of a shards index, version 3's boxes or version 2's pieces of rows
    [file, start, stop] (a scalar's one piece is its whole box). KeyError/TypeError/ValueError
    when malformed."""
    shape = tuple(int(d) for d in entry["shape"])
    if "chunks" in entry:
        out = []
        for rel, offsets, lengths in entry["chunks"]:
            box = Box(tuple(int(o) for o in offsets), tuple(int(n) for n in lengths))
            if len(box.offsets) != len(shape) or len(box.lengths) != len(shape):
                raise ValueError(f"chunk {box.offsets}/{box.lengths} has not the {len(shape)} dimensions of the tensor")
            out.append((str(rel), box))
        return out
    pieces = [(str(rel), int(a), int(b)) for rel, a, b in entry["pieces"]]
    if not shape:
        return [(rel, Box((), ())) for rel, _, _ in pieces]
    return [(rel, Box((a,) + (0,) * (len(shape) - 1), (b - a, *shape[1:]))) for rel, a, b in pieces]


def is_optimizer_file(path: str) -> bool:
    return path == OPTIMIZER_META or path.startswith(f"{OPTIMIZER}.") or path.startswith(f"{OPTIMIZER}-")
