"""Checkpoint layout: directory and file names, and which rank writes which tensors. Pure.

    checkpoints/
      step_00000100/
        model.safetensors                       or model-0000i-of-0000N.safetensors: each rank's rows
        model.shards.json                       every tensor's global shape and dtype, and which rows
                                                of it each file holds (its pieces)
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

FORMAT_NAME = "resilient_slurm-checkpoint"
FORMAT_VERSION = 2
"""2: sharded state (pieces of tensors, `<prefix>.shards.json`) and per-chunk CRCs in the manifest.
Version 1 checkpoints (whole tensors, HF-style `<prefix>.safetensors.index.json`) still load."""
READABLE_VERSIONS = (1, 2)
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
    """What every rank knows of one tensor of the state, whoever holds it."""

    name: str
    shape: tuple[int, ...]
    """Global shape."""
    dtype: str
    """safetensors dtype name (F32, BF16, I64, ...)."""
    itemsize: int
    sharded: bool
    """Each rank holds its `shard_rows`; otherwise every rank holds all of it and one writes it."""

    @property
    def rows(self) -> int:
        """Dim 0; a scalar counts as one row."""
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        n = self.itemsize
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class Piece:
    name: str
    start: int
    stop: int
    """Rows [start, stop) of the tensor."""


@dataclass(frozen=True)
class PieceFile:
    filename: str
    rank: int
    pieces: tuple[Piece, ...]


def plan_pieces(prefix: str, specs: list[TensorSpec], world_size: int, max_shard_bytes: int) -> list[PieceFile]:
    """The files of one prefix: each rank writes its own rows of every sharded tensor, and the
    replicated tensors are spread over the ranks by bytes (`plan_shards`, whole tensors); each
    rank's pieces, in state order, are cut into files of at most `max_shard_bytes`.

    Every rank computes the same plan from the same specs, so no rank has to tell another what it
    will write. One file gets the plain name; several get `-0000i-of-0000N`.
    """
    owner: dict[str, int] = {}
    replicated = [(s.name, s.nbytes) for s in specs if not s.sharded]
    for shard in plan_shards(prefix, replicated, world_size, 1 << 62):
        owner.update({n: shard.rank for n in shard.names})
    runs: list[tuple[int, list[Piece]]] = []
    for rank in range(world_size):
        current: list[Piece] = []
        current_bytes = 0
        for s in specs:
            if s.sharded:
                start, stop = shard_rows(s.rows, world_size, rank)
            elif owner[s.name] == rank:
                start, stop = 0, s.rows
            else:
                continue
            if stop <= start:
                continue
            nbytes = (stop - start) * s.row_bytes
            if current and current_bytes + nbytes > max_shard_bytes:
                runs.append((rank, current))
                current, current_bytes = [], 0
            current.append(Piece(s.name, start, stop))
            current_bytes += nbytes
        if current:
            runs.append((rank, current))
    if len(runs) == 1:
        return [PieceFile(f"{prefix}.safetensors", runs[0][0], tuple(runs[0][1]))]
    n = len(runs)
    return [PieceFile(f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors", rank, tuple(pieces))
            for i, (rank, pieces) in enumerate(runs)]


def shards_index(specs: list[TensorSpec], files: list[PieceFile]) -> dict:
    """`<prefix>.shards.json`: every tensor's shape and dtype, and its pieces [file, start, stop]."""
    pieces: dict[str, list[list]] = {s.name: [] for s in specs}
    for f in files:
        for p in f.pieces:
            pieces[p.name].append([f.filename, p.start, p.stop])
    return {"tensors": {s.name: {"shape": list(s.shape), "dtype": s.dtype, "pieces": pieces[s.name]}
                        for s in specs}}


def is_optimizer_file(path: str) -> bool:
    return path == OPTIMIZER_META or path.startswith(f"{OPTIMIZER}.") or path.startswith(f"{OPTIMIZER}-")


@dataclass(frozen=True)
class ShardFile:
    filename: str
    rank: int
    names: tuple[str, ...]


def plan_shards(prefix: str, sizes: list[tuple[str, int]], world_size: int, max_shard_bytes: int) -> list[ShardFile]:
    """Split tensors (in state-dict order) into files: a contiguous run per rank, balanced by bytes,
    each run cut into files of at most `max_shard_bytes` (a single tensor may exceed it).

    Every rank computes the same plan from the same names and sizes, so no rank has to tell
    another what it will write. One file gets the plain HF name; several get `-0000i-of-0000N`.
    """
    total = sum(n for _, n in sizes)
    per_rank: list[list[tuple[str, int]]] = [[] for _ in range(world_size)]
    done = 0
    for name, nbytes in sizes:
        # The rank whose share of [0, total) contains this tensor's midpoint.
        mid = done + nbytes / 2
        rank = min(int(mid * world_size / total), world_size - 1) if total else 0
        per_rank[rank].append((name, nbytes))
        done += nbytes
    runs: list[tuple[int, list[str]]] = []
    for rank, items in enumerate(per_rank):
        current: list[str] = []
        current_bytes = 0
        for name, nbytes in items:
            if current and current_bytes + nbytes > max_shard_bytes:
                runs.append((rank, current))
                current, current_bytes = [], 0
            current.append(name)
            current_bytes += nbytes
        if current:
            runs.append((rank, current))
    if len(runs) == 1:
        return [ShardFile(f"{prefix}.safetensors", runs[0][0], tuple(runs[0][1]))]
    n = len(runs)
    return [
        ShardFile(f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors", rank, tuple(names))
        for i, (rank, names) in enumerate(runs)
    ]


def index_for(shards: list[ShardFile], sizes: dict[str, int]) -> dict | None:
    """HF-style `*.safetensors.index.json` content for a sharded plan; None for a single file."""
    if len(shards) <= 1:
        return None
    weight_map = {name: shard.filename for shard in shards for name in shard.names}
    return {"metadata": {"total_size": sum(sizes[n] for n in weight_map)}, "weight_map": weight_map}
