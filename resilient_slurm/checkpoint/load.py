"""Resume: the newest checkpoint that verifies, from either tier, loaded in place with its checksums
checked on the way.

Candidates are every step in the hot tier or the cold one, newest first. A step missing from the
hot tier (a replacement node's empty disk), or whose hot copy fails, is copied back from the cold
tier into the hot one (checked file by file, marker last) and loaded from there. A checkpoint that
fails on any rank is skipped by all of them together, and moved aside (never deleted), so the
next is tried.

Every rank reads every file it needs, so any world size loads any checkpoint: model tensors and
optimizer state are keyed by name, the data position is a global sample count. The files are read
by one pool of threads in large ranges straight into the model's own tensors (and the optimizer's,
when it already has state of the right shape), with CRCs checked on the way.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.manifest import Manifest
from resilient_slurm.checkpoint.parallel_io import ShortFileError, read_files
from resilient_slurm.checkpoint.safetensors_io import (
    FormatError,
    TensorInfo,
    in_file,
    read_header,
)
from resilient_slurm.checkpoint.state import (
    model_tensors,
    optimizer_tensors,
    param_names,
    reseed_rng,
    restore_optimizer,
    restore_rng,
)
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.runtime.distributed import Comm


class LoadError(RuntimeError):
    """This checkpoint cannot be loaded into this run; the message says why."""


class ColdSource(Protocol):
    """The part of the cold tier a resume needs (`cold.ColdTier`)."""

    url: str

    def steps(self) -> list[int]: ...
    def download(self, step: int, dest: Path) -> Manifest: ...
    def describe(self, step: int) -> str: ...


@dataclass
class Restored:
    path: Path
    train_state: dict[str, Any]
    has_optimizer: bool
    source: str = "hot"
    """hot, or cold (copied back into the hot tier, then loaded)."""
    saved_world_size: int = 1
    rng: str = "restored"
    """restored: this rank's saved RNG states; reseeded: the checkpoint has none for this rank (it
    was saved by fewer ranks), so they are seeded from (run id, step, rank): reproducible, and
    different on every rank, as independent streams should be."""


@dataclass
class ResumeOutcome:
    restored: Restored | None
    skipped: list[tuple[str, str]]
    """Checkpoints (or tier copies) that failed, newest first, with the reason; failed hot
    copies have been quarantined."""
    touched_state: bool
    """A failed load may have overwritten part of the model: re-initialise before a fresh start."""


def resume(
    root: Path,
    comm: Comm,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    io_threads: int,
    cold: ColdSource | None = None,
    before_step: int | None = None,
) -> ResumeOutcome:
    """`cold` is consulted on rank 0 only (the others may pass None); `before_step`: only
    checkpoints of earlier steps (a rollback past an anomaly)."""
    skipped: list[tuple[str, str]] = []
    cold_steps: list[int] = []
    if comm.rank == 0:
        store.remove_partial_saves(root)
        if cold is not None:
            try:
                cold_steps = cold.steps()
            except Exception as e:  # noqa: BLE001 - an unreachable cold tier must not stop a resume
                skipped.append((cold.url, f"cold tier unreadable: {e.__class__.__name__}: {e}"))
    hot_steps = [s for s, _ in store.list_step_dirs(root)] if comm.rank == 0 else []
    hot_steps, cold_steps, skipped = comm.all_gather_object((hot_steps, cold_steps, skipped))[0]

    touched = False
    candidates = set(hot_steps) | set(cold_steps)
    for step in sorted((s for s in candidates if before_step is None or s < before_step), reverse=True):
        path = root / layout.step_dir_name(step)
        for source in [s for s, steps in (("hot", hot_steps), ("cold", cold_steps)) if step in steps]:
            if source == "cold":
                problem = _fetch(cold, step, root) if comm.rank == 0 else None  # type: ignore[arg-type]
                problem = comm.all_gather_object(problem)[0]
                if problem:
                    skipped.append(problem)
                    continue
            result, reason, loading = _attempt(path, comm.rank, model, optimizer, scheduler, io_threads)
            touched |= loading
            outcomes = comm.all_gather_object((result is not None, reason))
            if all(ok for ok, _ in outcomes):
                assert result is not None
                result.source = source
                return ResumeOutcome(result, skipped, False)
            skipped.append((str(path), "; ".join(sorted({r for ok, r in outcomes if not ok}))))
            if comm.rank == 0 and path.exists():
                store.quarantine(path)
            comm.barrier()
    return ResumeOutcome(None, skipped, touched)


def _attempt(
    path: Path, rank: int, model: nn.Module, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler, io_threads: int,
) -> tuple[Restored | None, str, bool]:
    """(result, reason, whether loading began and may have overwritten part of the state)."""
    verdict = verify(path, checksums=False)
    if not verdict.ok:
        return None, verdict.reason, False
    try:
        assert verdict.manifest is not None
        return load_into(path, verdict.manifest, rank, model, optimizer, scheduler, io_threads), "ok", True
    except (LoadError, FormatError, ValueError, KeyError, OSError) as e:
        return None, str(e), True


def _fetch(cold: ColdSource, step: int, root: Path) -> tuple[str, str] | None:
    """Rank 0: copy a cold checkpoint into the hot tier as `step_N/`; (where, why) on failure."""
    tmp = root / layout.tmp_dir_name(step)
    final = root / layout.step_dir_name(step)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        root.mkdir(parents=True, exist_ok=True)
        cold.download(step, tmp)
        if final.exists():
            store.quarantine(final)
        os.rename(tmp, final)
        store.fsync_dir(root)
    except Exception as e:  # noqa: BLE001 - any failure of the copy skips this cold checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        return cold.describe(step), f"copy from the cold tier failed: {e.__class__.__name__}: {e}"
    return None


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

    names = param_names(model)
    targets = model_tensors(model)
    existing = optimizer_tensors(optimizer, names)
    optim_state: dict[str, torch.Tensor] = {}

    def model_target(name: str, info: TensorInfo) -> torch.Tensor:
        if name not in targets:
            raise LoadError(f"checkpoint has tensor {name!r}, which this model does not")
        return targets[name]

    def optim_target(name: str, info: TensorInfo) -> torch.Tensor:
        t = existing.get(name)
        if t is None or t.dtype != info.dtype or tuple(t.shape) != info.shape or not t.is_contiguous() \
                or t.device.type != "cpu":
            t = torch.empty(info.shape, dtype=info.dtype)
        optim_state[name] = t
        return t

    optim_files = _tensor_files(layout.OPTIMIZER, manifest, docs)
    # One pool over the ranges of every file, so model and optimizer shards stream together.
    jobs = [(rel, model_target) for rel in _tensor_files(layout.MODEL, manifest, docs)]
    jobs += [(rel, optim_target) for rel in optim_files]
    headers = [read_header(str(path / rel)) for rel, _ in jobs]
    files = [in_file(str(path / rel), header, target_for) for (rel, target_for), header in zip(jobs, headers)]
    try:
        crcs = read_files(files, io_threads)
    except ShortFileError as e:
        raise LoadError(str(e)) from None
    for (rel, _), crc in zip(jobs, crcs):
        if crc != manifest.files[rel].crc32:
            raise LoadError(f"checksum mismatch in {rel}")
    loaded = {name for (_, target_for), h in zip(jobs, headers) if target_for is model_target for name in h.tensors}
    missing = sorted(set(targets) - loaded)
    if missing:
        raise LoadError(f"checkpoint lacks model tensors: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if optim_files:
        restore_optimizer(optimizer, names, docs[layout.OPTIMIZER_META], optim_state)
    else:
        optimizer.state.clear()
    scheduler.load_state_dict(docs[layout.SCHEDULER])
    rng = docs.get(layout.rng_file(rank))
    if rng is not None:
        restore_rng(rng)
    else:
        reseed_rng(zlib.crc32(f"{train_state.get('run_id', '')}:{train_state['step']}:{rank}".encode()))
    return Restored(path, train_state, bool(optim_files), saved_world_size=manifest.world_size,
                    rng="restored" if rng is not None else "reseeded")


def _tensor_files(prefix: str, manifest: Manifest, docs: dict[str, Any]) -> list[str]:
    single = f"{prefix}.safetensors"
    if single in manifest.files:
        return [single]
    index = docs.get(layout.index_file(prefix))
    return sorted(set(index["weight_map"].values())) if index else []


def _read_json(path: Path, rel: str, manifest: Manifest) -> Any:
    raw = (path / rel).read_bytes()
    if zlib.crc32(raw) != manifest.files[rel].crc32:
        raise LoadError(f"checksum mismatch in {rel}")
    return json.loads(raw)
