"""Resume: the newest checkpoint that verifies, loaded in place with its checksums checked on the way.

Every rank reads every file it needs (any world size can load any checkpoint), straight into the
model's own tensors. A checkpoint that fails on any rank is skipped by all of them together, and
afterwards moved aside (never deleted), so the next-newest is tried.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.manifest import Manifest
from resilient_slurm.checkpoint.safetensors_io import FormatError, TensorInfo, read_header, read_into
from resilient_slurm.checkpoint.state import model_tensors, param_names, restore_optimizer, restore_rng
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.distributed import Comm


class LoadError(RuntimeError):
    """This checkpoint cannot be loaded into this run; the message says why."""


@dataclass
class Restored:
    path: Path
    train_state: dict[str, Any]
    has_optimizer: bool


@dataclass
class ResumeOutcome:
    restored: Restored | None
    skipped: list[tuple[Path, str]]
    """Checkpoints that failed, newest first, with the reason; they have been quarantined."""
    touched_state: bool
    """A failed load may have overwritten part of the model: re-initialise before a fresh start."""


def resume(
    root: Path,
    comm: Comm,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    io_threads: int,
    before_step: int | None = None,
) -> ResumeOutcome:
    """`before_step`: only checkpoints of earlier steps (a rollback past an anomaly)."""
    if comm.rank == 0:
        store.remove_partial_saves(root)
    comm.barrier()
    skipped: list[tuple[Path, str]] = []
    restored: Restored | None = None
    touched = False
    for step, path in store.list_step_dirs(root):
        if before_step is not None and step >= before_step:
            continue
        verdict = verify(path, checksums=False)
        reason = verdict.reason
        result: Restored | None = None
        if verdict.ok:
            touched = True
            try:
                result = load_into(path, verdict.manifest, comm.rank, model, optimizer, scheduler, io_threads)  # type: ignore[arg-type]
            except (LoadError, FormatError, ValueError, KeyError, OSError) as e:
                reason = str(e)
        outcomes = comm.all_gather_object((result is not None, reason))
        if all(ok for ok, _ in outcomes):
            restored = result
            break
        reasons = sorted({r for ok, r in outcomes if not ok})
        skipped.append((path, "; ".join(reasons)))
    comm.barrier()
    if comm.rank == 0:
        for path, _ in skipped:
            if path.exists():
                store.quarantine(path)
    comm.barrier()
    return ResumeOutcome(restored, skipped, touched and restored is None)


def load_into(
    path: Path,
    manifest: Manifest,
    rank: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    io_threads: int,
) -> Restored:
    """Load one verified-looking checkpoint; raise LoadError (or FormatError) on any mismatch."""
    # Small JSON files first: nothing is applied until every byte has been checked.
    docs = {rel: _read_json(path, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    train_state = docs[layout.TRAIN_STATE]

    targets = model_tensors(model)
    optim_state: dict[str, torch.Tensor] = {}

    def model_target(name: str, info: TensorInfo) -> torch.Tensor:
        if name not in targets:
            raise LoadError(f"checkpoint has tensor {name!r}, which this model does not")
        return targets[name]

    def optim_target(name: str, info: TensorInfo) -> torch.Tensor:
        optim_state[name] = torch.empty(info.shape, dtype=info.dtype)
        return optim_state[name]

    optim_files = _tensor_files(layout.OPTIMIZER, manifest, docs)
    # One pool over every file, so model and optimizer shards stream from disk at the same time.
    jobs: list[tuple[str, Callable[[str, TensorInfo], torch.Tensor]]]
    jobs = [(f, model_target) for f in _tensor_files(layout.MODEL, manifest, docs)]
    jobs += [(f, optim_target) for f in optim_files]
    loaded = _load_files(path, manifest, jobs, io_threads)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise LoadError(f"checkpoint lacks model tensors: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if optim_files:
        restore_optimizer(optimizer, param_names(model), docs[layout.OPTIMIZER_META], optim_state)
    else:
        optimizer.state.clear()
    scheduler.load_state_dict(docs[layout.SCHEDULER])
    rng = docs.get(layout.rng_file(rank))
    if rng is not None:
        restore_rng(rng)
    return Restored(path, train_state, bool(optim_files))


def _tensor_files(prefix: str, manifest: Manifest, docs: dict[str, Any]) -> list[str]:
    single = f"{prefix}.safetensors"
    if single in manifest.files:
        return [single]
    index = docs.get(layout.index_file(prefix))
    return sorted(set(index["weight_map"].values())) if index else []


def _load_files(
    path: Path, manifest: Manifest, jobs: list[tuple[str, Callable[[str, TensorInfo], torch.Tensor]]],
    io_threads: int,
) -> set[str]:
    """Read each (file, target_for) in parallel; the names of every tensor read."""
    def one(job: tuple[str, Callable[[str, TensorInfo], torch.Tensor]]) -> set[str]:
        rel, target_for = job
        f = str(path / rel)
        header = read_header(f)
        if read_into(f, header, target_for) != manifest.files[rel].crc32:
            raise LoadError(f"checksum mismatch in {rel}")
        return set(header.tensors)

    with ThreadPoolExecutor(max_workers=max(1, min(io_threads, len(jobs)))) as pool:
        return set().union(*pool.map(one, jobs)) if jobs else set()


def _read_json(path: Path, rel: str, manifest: Manifest) -> Any:
    raw = (path / rel).read_bytes()
    if zlib.crc32(raw) != manifest.files[rel].crc32:
        raise LoadError(f"checksum mismatch in {rel}")
    return json.loads(raw)
