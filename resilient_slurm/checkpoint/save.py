"""The atomic, sharded save protocol, across all ranks.

1. rank 0 makes `.tmp.step_N/`; barrier
2. every rank writes the shard files it owns (threads, one per file) and fsyncs them
3. all-gather of every rank's file sizes and CRCs (doubles as the barrier before the marker)
4. rank 0 writes the manifest (the commit marker) last, fsyncs the directory and renames it to
   `step_N/`, then fsyncs the parent; barrier

A crash anywhere before the rename leaves only a `.tmp.` directory, which no reader trusts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.manifest import FileEntry, Manifest
from resilient_slurm.checkpoint.safetensors_io import FileDigest, write_bytes, write_file
from resilient_slurm.checkpoint.state import Snapshot
from resilient_slurm.distributed import Comm
from resilient_slurm.events import utc_now


class SaveError(RuntimeError):
    """A save failed on some rank; the previous checkpoints are untouched."""


@dataclass(frozen=True)
class SaveResult:
    path: Path
    nbytes: int
    seconds: float
    replaced: Path | None
    """Where an existing directory for the same step was moved (it failed verification earlier)."""


def save(root: Path, step: int, snap: Snapshot, comm: Comm, max_shard_bytes: int, io_threads: int) -> SaveResult:
    start = time.perf_counter()
    tmp = root / layout.tmp_dir_name(step)
    final = root / layout.step_dir_name(step)
    if comm.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / layout.RNG_DIR).mkdir(parents=True)
    comm.barrier()

    plans = _plans(snap, comm.world_size, max_shard_bytes)
    outcome: tuple[bool, object]
    try:
        outcome = (True, _write_rank_files(tmp, snap, plans, comm, io_threads))
    except Exception as e:  # noqa: BLE001 - every rank must reach the all-gather, or the others hang
        outcome = (False, f"rank {comm.rank}: {e.__class__.__name__}: {e}")
    results = comm.all_gather_object((_digest(plans), outcome))
    failures = [detail for _, (ok, detail) in results if not ok]
    if len({plan for plan, _ in results}) > 1:
        failures.append("ranks disagree on which rank writes which tensor (different state on different ranks)")
    if failures:
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise SaveError("; ".join(str(f) for f in failures))

    replaced = None
    files: dict[str, FileEntry] = {}
    for _, (_, entries) in results:
        files.update(entries)  # type: ignore[arg-type]
    if comm.rank == 0:
        store.fsync_dir(tmp / layout.RNG_DIR)
        manifest = Manifest(step=step, world_size=comm.world_size, files=files, created=utc_now())
        write_bytes(str(tmp / layout.MANIFEST), manifest.to_json())
        store.fsync_dir(tmp)
        if final.exists():
            replaced = store.quarantine(final)
        os.rename(tmp, final)
        store.fsync_dir(root)
    comm.barrier()
    nbytes = sum(e.nbytes for e in files.values())
    return SaveResult(final, nbytes, time.perf_counter() - start, replaced)


def _plans(snap: Snapshot, world_size: int, max_shard_bytes: int) -> dict[str, tuple[list[layout.ShardFile], dict[str, int]]]:
    plans = {}
    for prefix, tensors in ((layout.MODEL, snap.model), (layout.OPTIMIZER, snap.optimizer)):
        if tensors:
            sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
            plans[prefix] = (layout.plan_shards(prefix, list(sizes.items()), world_size, max_shard_bytes), sizes)
    return plans


def _digest(plans: dict[str, tuple[list[layout.ShardFile], dict[str, int]]]) -> str:
    text = repr([(s.filename, s.rank, s.names) for shards, _ in plans.values() for s in shards])
    return hashlib.sha256(text.encode()).hexdigest()


def _write_rank_files(tmp: Path, snap: Snapshot, plans: dict, comm: Comm, io_threads: int) -> dict[str, FileEntry]:
    jobs: list[tuple[str, object]] = []
    for prefix, (plan, sizes) in plans.items():
        tensors = snap.model if prefix == layout.MODEL else snap.optimizer
        for shard in plan:
            if shard.rank == comm.rank:
                jobs.append((shard.filename, [(n, _cpu_contiguous(tensors[n])) for n in shard.names]))
        index = layout.index_for(plan, sizes)
        if index is not None and comm.rank == 0:
            jobs.append((layout.index_file(prefix), _json(index)))
    jobs.append((layout.rng_file(comm.rank), _json(snap.rng)))
    if comm.rank == 0:
        jobs.extend((name, _json(body)) for name, body in snap.json_files.items())

    def run(job: tuple[str, object]) -> tuple[str, FileDigest]:
        rel, payload = job
        path = str(tmp / rel)
        digest = write_bytes(path, payload) if isinstance(payload, bytes) else write_file(path, payload)  # type: ignore[arg-type]
        return rel, digest

    with ThreadPoolExecutor(max_workers=max(1, min(io_threads, len(jobs)))) as pool:
        return {rel: FileEntry(d.nbytes, d.crc32) for rel, d in pool.map(run, jobs)}


def _cpu_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _json(body: object) -> bytes:
    return json.dumps(body, indent=1, sort_keys=True).encode()
