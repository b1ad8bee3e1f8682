"""Resume: the newest checkpoint that verifies, from either tier, loaded in place with its checksums
checked on the way.

Candidates are every step in the hot tier or the cold one, newest first. A step missing from the
hot tier (a replacement node's empty disk), or whose hot copy fails, is copied back from the cold
tier into the hot one (checked file by file, marker last) and loaded from there. A checkpoint that
fails on any rank is skipped by all of them together, and moved aside (never deleted), so the
next is tried.

Any layout loads any checkpoint: model tensors and optimizer state are keyed by name and stored
as chunks (boxes of the tensor), and each rank reads only the overlap of the saved chunks with the
box it holds now (`reader.py`); the data position is a global sample count. At the layout that
wrote it, each rank reads its own files whole, in large parallel ranges straight into its shards,
with CRCs checked on the way.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from resilient_slurm.checkpoint.collectives import Collectives, RunCollectives
from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.manifest import Manifest
from resilient_slurm.checkpoint.chunks import Box, whole
from resilient_slurm.checkpoint.reader import LoadError, Reader, Saved, overlapping, read_json, saved_tensors
from resilient_slurm.checkpoint.safetensors_io import FormatError
from resilient_slurm.checkpoint.state import (
    local_box,
    model_tensors,
    optimizer_tensors,
    param_names,
    reseed_rng,
    restore_optimizer,
    restore_rng,
)
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.errors import InputError


Refusal = Callable[[TrainState], str | None]
"""refusal(train_state): why the run must not continue from a checkpoint (None: it may)."""


class CheckpointRefused(InputError):
    """A valid checkpoint this run must not continue from (another base model, another kind of
    training): the resume stops, instead of skipping to an older checkpoint or a fresh start."""


class ModelChanged(CheckpointRefused):
    """A healthy checkpoint whose tensors do not fit this run's model or optimizer (a tensor of another
    shape, one either side lacks, other parameter groups): the run's code changed since it was
    saved. The user's to fix, not damaged storage: nothing is moved aside, and older checkpoints,
    which would not fit either, are not tried."""


_CHANGED_FIX = ("the model's code or config changed since this checkpoint was saved; restore the code that saved "
                "it, or start a new run (another run.name)")


class ColdSource(Protocol):
    """The part of the cold tier a resume needs (`cold.ColdTier`)."""

    url: str

    def steps(self) -> list[int]: ...
    def download(self, step: int, dest: Path) -> Manifest: ...
    def describe(self, step: int) -> str: ...


@dataclass
class Restored:
    path: Path
    train_state: TrainState
    has_optimizer: bool
    source: str = "hot"
    """hot, or cold (copied back into the hot tier, then loaded)."""
    saved_world_size: int = 1
    bytes_read: int = 0
    """Bytes of tensor files this rank read (a resume at another world size reads only its rows)."""
    unheld: frozenset[str] = frozenset()
    """Saved tensors this rank does not hold (another pipeline stage's, or another model's)."""
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
    comm: RunCollectives,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    io_threads: int,
    cold: ColdSource | None = None,
    before_step: int | None = None,
    refusal: Refusal | None = None,
) -> ResumeOutcome:
    """`cold` is consulted on rank 0 only (the others may pass None); `before_step`: only
    checkpoints of earlier steps (a rollback past an anomaly). A checkpoint `refusal` objects to
    raises CheckpointRefused on every rank, before anything of it is loaded."""
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
                problem = fetch(cold, step, root) if comm.rank == 0 else None  # type: ignore[arg-type]
                problem = comm.all_gather_object(problem)[0]
                if problem:
                    skipped.append(problem)
                    continue
            result, reason, loading, refused = attempt(path, comm.rank, model, optimizer, scheduler, io_threads,
                                                       refusal)
            result, reason, refused = held_somewhere(comm, result, reason, refused)
            touched |= loading
            outcomes = comm.all_gather_object((result is not None, reason, refused))
            refusals = sorted({r for _, _, r in outcomes if r})
            if refusals:
                raise CheckpointRefused(f"{path}: {refusals[0]}")
            if all(ok for ok, _, _ in outcomes):
                assert result is not None
                result.source = source
                return ResumeOutcome(result, skipped, False)
            skipped.append((str(path), "; ".join(sorted({r for ok, r, _ in outcomes if not ok}))))
            if comm.rank == 0 and path.exists():
                store.quarantine(path)
            comm.barrier()
    return ResumeOutcome(None, skipped, touched)


def attempt(
    path: Path, rank: int, model: nn.Module, optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None, io_threads: int, refusal: Refusal | None,
) -> tuple[Restored | None, str, bool, str | None]:
    """(result, reason, whether loading began and may have overwritten part of the state, why the
    checkpoint is refused)."""
    verdict = verify(path, checksums=False)
    if not verdict.ok:
        return None, verdict.reason, False, None
    try:
        assert verdict.manifest is not None
        if refusal is not None:
            refused = refusal(TrainState.from_json(read_json(path, layout.TRAIN_STATE, verdict.manifest)))
            if refused:
                return None, refused, False, refused
        return load_into(path, verdict.manifest, rank, model, optimizer, scheduler, io_threads), "ok", True, None
    except ModelChanged as e:  # found before anything was read into the state
        return None, str(e), False, str(e)
    except (LoadError, FormatError, ValueError, KeyError, OSError) as e:
        return None, str(e), True, None


def fetch(cold: ColdSource, step: int, root: Path) -> tuple[str, str] | None:
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
        store.fsync_path(root)
    except Exception as e:  # noqa: BLE001 - any failure of the copy skips this cold checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        return cold.describe(step), f"copy from the cold tier failed: {e.__class__.__name__}: {e}"
    return None


def needed_files(path: Path, manifest: Manifest, model: nn.Module) -> set[str]:
    """The tensor files that hold some of what this rank holds now: what `load_into` will read,
    besides the JSON files (which must be in `path` already). A node-local resume brings these to
    the node."""
    docs = {rel: read_json(path, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    saved_model = saved_tensors(path, layout.MODEL, manifest, docs)
    saved_optim = saved_tensors(path, layout.OPTIMIZER, manifest, docs)
    out: set[str] = set()
    for name, h in model_tensors(model).items():
        if name in saved_model:
            out |= overlapping(saved_model[name], h.box)
    by_name = {name: p for p, name in param_names(model).items()}
    for name, saved in saved_optim.items():
        param = by_name.get(name.rsplit(".", 1)[0])
        if param is not None:
            out |= overlapping(saved, _state_box(saved, param))
    return out


def model_changed(saved: dict[str, Saved], wanted: dict[str, tuple[int, ...]]) -> str | None:
    """How this rank's tensors differ from the checkpoint's (by name and global shape), or None. A
    saved tensor this rank lacks may be another pipeline stage's: `held_somewhere` asks every rank."""
    missing = sorted(set(wanted) - set(saved))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"this model has tensor {missing[0]!r}{more}, which the checkpoint does not hold"
    for name, shape in wanted.items():
        if tuple(shape) != saved[name].shape:
            return (f"tensor {name!r} is {list(saved[name].shape)} in the checkpoint and {list(shape)} in this "
                    f"model")
    return None


def optimizer_changed(meta: dict[str, Any], optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str],
                      saved: dict[str, Saved]) -> str | None:
    """How the optimizer differs from the checkpoint's, or None: its type, a parameter the saved one
    did not have, or parameters the saved one kept in one group that this run puts in groups of
    different settings (another layout may hold fewer of each group: a pipeline stage)."""
    if meta.get("type") != type(optimizer).__name__:
        return f"the checkpoint's optimizer is {meta.get('type')} and this run's is {type(optimizer).__name__}"
    saved_in = {name: i for i, g in enumerate(meta.get("param_groups", [])) for name in g["params"]}
    here: dict[int, tuple[str, dict[str, Any]]] = {}
    for group in optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        for p in group["params"]:
            name = names[p]
            if name not in saved_in:
                return f"this run's optimizer has parameter {name!r}, which the checkpoint's did not"
            first, seen = here.setdefault(saved_in[name], (name, settings))
            differ = sorted(k for k in seen.keys() | settings.keys() if seen.get(k) != settings.get(k))
            if differ:
                return (f"the checkpoint's optimizer kept {first!r} and {name!r} in one parameter group, and this "
                        f"run's puts them in groups of different {differ[0]} ({seen.get(differ[0])} and "
                        f"{settings.get(differ[0])})")
    return None


def _state_box(saved: Saved, param: torch.Tensor) -> Box:
    """The box of an optimizer state tensor this rank holds: its parameter's, for state shaped
    like it; the whole of the rest (a step count)."""
    return local_box(param) if saved.shape == tuple(param.shape) else whole(saved.shape)


def load_into(
    path: Path,
    manifest: Manifest,
    rank: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    io_threads: int,
) -> Restored:
    """Load one verified-looking checkpoint into this rank's shards; ModelChanged, before anything is
    read, when its tensors do not fit this model; LoadError (or FormatError) when it is damaged."""
    # Small JSON files first: nothing is applied until every byte has been checked.
    docs = {rel: read_json(path, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    train_state = TrainState.from_json(docs[layout.TRAIN_STATE])
    names = param_names(model)
    by_name = {name: p for p, name in names.items()}
    saved_model = saved_tensors(path, layout.MODEL, manifest, docs)
    # Without an optimizer to restore into (a user's loop may have none), its saved state is not read.
    saved_optim = saved_tensors(path, layout.OPTIMIZER, manifest, docs) if optimizer is not None else {}
    targets = model_tensors(model)
    # A saved tensor this rank does not hold may be another rank's (pipeline stages hold different
    # layers): `held_somewhere` checks, over all ranks, that some rank holds each one.
    unheld = set(saved_model) - set(targets)
    changed = model_changed(saved_model, {name: h.spec.shape for name, h in targets.items()})
    if changed is None and optimizer is not None and layout.OPTIMIZER_META in docs:
        changed = optimizer_changed(docs[layout.OPTIMIZER_META], optimizer, names, saved_optim)
    if changed is not None:
        raise ModelChanged(f"{changed}: {_CHANGED_FIX}")

    reader = Reader(path, manifest, io_threads)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, h in targets.items():
        # Straight into the parameter's own storage when it can take the bytes, else via the CPU.
        direct = h.data.device.type == "cpu" and h.data.is_contiguous() and h.data.dtype == saved_model[name].dtype
        dest = h.data if direct else torch.empty(h.data.shape, dtype=saved_model[name].dtype)
        reader.add(name, saved_model[name], dest, h.box, h.spec.shape)
        if not direct:
            copies.append((h.data, dest))
    existing = optimizer_tensors(optimizer, names) if optimizer is not None else {}
    optim_state: dict[str, torch.Tensor] = {}
    for name, saved in saved_optim.items():
        param = by_name.get(name.rsplit(".", 1)[0])
        if param is None:
            unheld.add(name)
            continue
        box = _state_box(saved, param)
        shape = box.lengths
        # Into the state the optimizer already has (a rollback) when it fits: no second copy of it.
        old = existing[name].data if name in existing else None
        fits = old is not None and old.device.type == "cpu" and old.is_contiguous() and old.dtype == saved.dtype \
            and tuple(old.shape) == shape
        dest = old if fits and old is not None else torch.empty(shape, dtype=saved.dtype)
        reader.add(name, saved, dest, box)
        optim_state[name] = dest
    reader.run()
    with torch.no_grad():
        for target, loaded in copies:
            target.copy_(loaded)
    if optimizer is not None and saved_optim:
        restore_optimizer(optimizer, names, docs[layout.OPTIMIZER_META], optim_state)
    elif optimizer is not None:
        optimizer.state.clear()
    if scheduler is not None and layout.SCHEDULER in docs:
        scheduler.load_state_dict(docs[layout.SCHEDULER])
    rng = docs.get(layout.rng_file(rank))
    if rng is not None:
        restore_rng(rng)
    else:
        reseed_rng(zlib.crc32(f"{train_state.run_id}:{train_state.step}:{rank}".encode()))
    return Restored(path, train_state, bool(saved_optim), saved_world_size=manifest.world_size,
                    rng="restored" if rng is not None else "reseeded", bytes_read=reader.bytes_read,
                    unheld=frozenset(unheld))


def held_somewhere(comm: Collectives, result: Restored | None, reason: str,
                   refused: str | None) -> tuple[Restored | None, str, str | None]:
    """Every rank, after its `attempt`: a load that succeeded on every rank is refused when some
    saved tensor is held by no rank (the model changed since the save). Collective."""
    unheld = comm.all_gather_object(None if result is None else sorted(result.unheld))
    if result is None or any(u is None for u in unheld):
        return result, reason, refused
    nowhere = sorted(set.intersection(*(set(u) for u in unheld)))
    if nowhere:
        why = f"the checkpoint holds tensor {nowhere[0]!r}, which no rank of this model holds: {_CHANGED_FIX}"
        return None, why, why
    return result, reason, refused
