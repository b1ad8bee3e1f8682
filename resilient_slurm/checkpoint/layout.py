"""Checkpoint layout: directory and file names, and which rank writes which tensors. Pure.

    checkpoints/
      step_00000100/
        model.safetensors                       (or model-0000i-of-0000N.safetensors + model.safetensors.index.json)
        optimizer.safetensors                   (or shards + optimizer.safetensors.index.json)
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
FORMAT_VERSION = 1
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
    return f"{prefix}.safetensors.index.json"


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
