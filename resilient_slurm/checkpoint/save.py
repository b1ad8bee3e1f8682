"""The atomic, sharded save protocol, across all ranks.

1. rank 0 makes `.tmp.step_N/`; the ranks agree on the plan (`exchange.py`: one small all-gather
   in a steady run, which doubles as the barrier after the directory is made)
2. every rank writes the chunk files it owns (`parallel_io`: threads, large direct writes) and
   fsyncs them
3. all-gather of every rank's file sizes and CRCs (doubles as the barrier before the marker)
4. rank 0 checks the directory's structure (sizes, headers, index entries), writes the manifest
   (the commit marker) last, fsyncs the directory and renames it to `step_N/`, then fsyncs the
   parent; an all-gather of that outcome ends the save on every rank

A crash anywhere before the rename leaves only a `.tmp.` directory, which no reader trusts. A
failure on any rank (disk full, I/O error) fails the save on every rank, with every reason.

On a node-local hot tier (`nodes.py`) each node has its own directory: its leader makes the
`.tmp.` directory there, every rank writes into its node's, and each leader checks the files of its
own node and commits its directory (the whole manifest, marker last, then the rename). A node that
fails to commit fails the save: the leaders that did commit delete theirs. A crash between two
nodes' commits leaves a checkpoint some of whose files no node holds, which a resume passes over.

The same protocol serves the synchronous save (written straight from the live tensors) and the
background one (written from staged copies, with collectives on the checkpoint's own process
group: `group.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.collectives import Collectives
from resilient_slurm.checkpoint.exchange import Agreed, PlanFailed, agree
from resilient_slurm.checkpoint.manifest import FileEntry, Manifest
from resilient_slurm.checkpoint.nodes import Spread
from resilient_slurm.checkpoint.parallel_io import OutFile, write_files
from resilient_slurm.checkpoint.safetensors_io import FormatError, out_file, read_header, write_bytes
from resilient_slurm.checkpoint.state import Snapshot
from resilient_slurm.checkpoint.verify import check_files
from resilient_slurm.files import utc_stamp


class SaveError(RuntimeError):
    """A save failed on some rank; the previous checkpoints are untouched."""


@dataclass(frozen=True)
class SaveResult:
    path: Path
    nbytes: int
    seconds: float
    replaced: Path | None
    """Where an existing directory for the same step was moved (it failed verification earlier)."""
    manifest: Manifest | None = None
    by_rank: tuple[tuple[str, ...], ...] = ()
    """The files each rank wrote (a node-local tier copies them to their buddies)."""


@dataclass(frozen=True)
class RankFiles:
    """The files one rank writes for one checkpoint."""

    tensors: list[tuple[str, list[tuple[str, torch.Tensor]]]]
    """Chunk files: path inside the checkpoint, and its tensors in file order."""
    blobs: list[tuple[str, bytes]]
    """Small JSON files."""
    plan: str
    """Digest of the whole plan: every rank must have computed the same one."""
    nbytes: int
    """Bytes of tensor data in the whole checkpoint (all ranks)."""
    problem: str | None = None
    """Why this rank cannot write its part (it fails the save on every rank at the commit)."""


def tmp_path(root: Path, step: int) -> Path:
    return root / layout.tmp_dir_name(step)


def prepare(root: Path, step: int, snap: Snapshot, comm: Collectives, max_shard_bytes: int,
            spread: Spread | None = None) -> RankFiles:
    """Steps 1 of the protocol: the leader (rank 0, or each node's) makes the temporary directory,
    then the ranks agree on the plan; this rank's files. SaveError on every rank alike when the
    states do not make a checkpoint (the directory is removed)."""
    tmp = tmp_path(root, step)
    leader = comm.rank == 0 if spread is None else spread.is_leader(comm.rank)
    if leader:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / layout.RNG_DIR).mkdir(parents=True)
    try:
        return rank_files(snap, agree(snap, comm, max_shard_bytes), comm.rank)
    except PlanFailed as e:
        if leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise SaveError(str(e)) from None


def rank_files(snap: Snapshot, agreed: Agreed, rank: int) -> RankFiles:
    tensors: list[tuple[str, list[tuple[str, torch.Tensor]]]] = []
    blobs: list[tuple[str, bytes]] = []
    plan = agreed.plan
    total = sum(s.nbytes for specs in plan.specs.values() for s in specs)
    for prefix, f in plan.rank_files(rank):
        named = snap.model if prefix == layout.MODEL else snap.optimizer
        mismatch = next((c for c in f.chunks if named[c.name].box != c.box), None)
        if mismatch is not None:
            return RankFiles([], [], plan.digest, total, f"rank {rank}: {mismatch.name}: it holds "
                             f"{named[mismatch.name].box.describe()}, the plan wants {mismatch.box.describe()} "
                             f"(is the mesh made of this process group's ranks?)")
        tensors.append((f.filename, [(c.name, named[c.name].data) for c in f.chunks]))
    blobs.append((layout.rng_file(rank), _json(snap.rng)))
    if rank == 0:
        blobs += [(layout.shards_file(prefix), index) for prefix, index in agreed.indexes.items()]
        blobs += [(name, _json(body)) for name, body in snap.json_files.items()]
        if agreed.optimizer_json is not None:
            blobs.append((layout.OPTIMIZER_META, _json(agreed.optimizer_json)))
    return RankFiles(tensors, blobs, plan.digest, total)


def save(root: Path, step: int, snap: Snapshot, comm: Collectives, max_shard_bytes: int, io_threads: int,
         check: bool = True, spread: Spread | None = None) -> SaveResult:
    """Save synchronously, straight from the snapshot's tensors."""
    files = prepare(root, step, snap, comm, max_shard_bytes, spread)
    tmp = tmp_path(root, step)
    outs = [out_file(str(tmp / rel), [(n, _cpu_contiguous(t)) for n, t in named]) for rel, named in files.tensors]
    return write_and_commit(root, step, files.plan, outs, files.blobs, comm, io_threads, check, spread,
                            problem=files.problem)


def write_and_commit(
    root: Path, step: int, plan: str, outs: list[OutFile], blobs: list[tuple[str, bytes]], comm: Collectives,
    io_threads: int, check: bool = True, spread: Spread | None = None, direct: bool = True,
    written: Callable[[], None] | None = None, problem: str | None = None,
) -> SaveResult:
    """Steps 2-4 above for this rank's files (`outs` live in `tmp_path(root, step)`, which `prepare`
    made); `spread`: the ranks' nodes when `root` is this node's own directory (a node-local hot
    tier, the memory tier).

    `check=False` skips rank 0's structural check before the marker (emergency saves short of time).
    `direct=False` writes through the page cache (`parallel_io.write_files`). `written()` is called
    once this rank's bytes are all out of the segments, written or not, before the collectives: from
    then on the tensors they came from may change.
    """
    start = time.perf_counter()
    tmp = tmp_path(root, step)
    final = root / layout.step_dir_name(step)

    outcome = (False, problem) if problem else _write_mine(tmp, outs, blobs, io_threads, direct, written, comm.rank)
    results = comm.all_gather_object((plan, outcome))
    failures = [str(detail) for _, (ok, detail) in results if not ok]
    if len({p for p, _ in results}) > 1:
        failures.append("ranks disagree on which rank writes which tensor (different state on different ranks)")
    files: dict[str, FileEntry] = {}
    by_rank: list[tuple[str, ...]] = []
    if not failures:
        for _, (_, entries) in results:
            files.update(entries)  # type: ignore[arg-type]
            by_rank.append(tuple(entries))  # type: ignore[arg-type]
    manifest = Manifest(step=step, world_size=comm.world_size, files=files, created=utc_stamp())

    if spread is not None:
        replaced = _commit_nodes(root, tmp, final, manifest, by_rank, comm, spread, failures)
    else:
        commit: tuple[str | None, Path | None] = (None, None)
        if comm.rank == 0:
            commit = ("; ".join(failures), None) if failures else _commit(root, tmp, final, manifest, check)
            if commit[0]:
                shutil.rmtree(tmp, ignore_errors=True)
        error, replaced = comm.all_gather_object(commit)[0]
        if error:
            raise SaveError(error)
    nbytes = sum(e.nbytes for e in files.values())
    return SaveResult(final, nbytes, time.perf_counter() - start, replaced, manifest, tuple(by_rank))


def _write_mine(tmp: Path, outs: list[OutFile], blobs: list[tuple[str, bytes]], io_threads: int, direct: bool,
                written: Callable[[], None] | None, rank: int) -> tuple[bool, object]:
    """Write this rank's files: (True, their entries) or (False, why not)."""
    try:
        with ThreadPoolExecutor(max_workers=1) as side:
            # The small files' fsyncs (a journal commit each) overlap the shard files' writes.
            small = side.submit(_write_blobs, tmp, blobs)
            try:
                digests = write_files(outs, io_threads, direct)
            finally:
                if written is not None:
                    written()
            entries = {os.path.relpath(o.path, tmp): FileEntry(d.nbytes, d.crc32, d.chunks)
                       for o, d in zip(outs, digests)}
            entries.update(small.result())
        return True, entries
    except Exception as e:  # noqa: BLE001 - every rank must reach the all-gather, or the others hang
        return False, f"rank {rank}: {e.__class__.__name__}: {e}"


def _write_blobs(tmp: Path, blobs: list[tuple[str, bytes]]) -> dict[str, FileEntry]:
    entries = {}
    for rel, data in blobs:
        d = write_bytes(str(tmp / rel), data)
        entries[rel] = FileEntry(d.nbytes, d.crc32, d.chunks)
    return entries


def _commit_nodes(root: Path, tmp: Path, final: Path, manifest: Manifest, by_rank: list[tuple[str, ...]],
                  comm: Collectives, spread: Spread, failures: list[str]) -> Path | None:
    """Each leader commits its node's directory; on any failure, those that did undo theirs."""
    leader = spread.is_leader(comm.rank)
    outcome: tuple[str | None, Path | None] = (None, None)
    if leader:
        if failures:
            outcome = ("; ".join(failures), None)
        else:
            mine = [rel for r in spread.ranks_on(spread.nodes[comm.rank]) for rel in by_rank[r]]
            problem = _check_node_files(tmp, manifest, mine)
            outcome = (f"node {spread.nodes[comm.rank]}: {problem}", None) if problem else \
                _commit(root, tmp, final, manifest, check=False)
        if outcome[0]:
            shutil.rmtree(tmp, ignore_errors=True)
    outcomes = comm.all_gather_object(outcome)
    errors = sorted({e for e, _ in outcomes if e})
    if errors:
        if leader and outcome[0] is None:
            store.delete(final)
        raise SaveError("; ".join(errors))
    return outcome[1]


def _check_node_files(tmp: Path, manifest: Manifest, rels: list[str]) -> str | None:
    """The files this node wrote: there, of their size, and safetensors ones with a header that parses."""
    for rel in rels:
        path = tmp / rel
        if not path.is_file() or path.stat().st_size != manifest.files[rel].nbytes:
            return f"written file {rel} is missing or not {manifest.files[rel].nbytes} bytes"
        if rel.endswith(".safetensors"):
            try:
                read_header(str(path))
            except FormatError as e:
                return f"bad safetensors header in {rel}: {e}"
    return None


def _commit(root: Path, tmp: Path, final: Path, manifest: Manifest, check: bool) -> tuple[str | None, Path | None]:
    """Marker last, then the rename. Returns (error or None, where a same-step dir went)."""
    try:
        if check:
            problem = check_files(tmp, manifest, checksums=False)
            if problem:
                return f"written files fail verification: {problem}", None
        store.fsync_path(tmp / layout.RNG_DIR)
        write_bytes(str(tmp / layout.MANIFEST), manifest.to_json())
        store.fsync_path(tmp)
        replaced = store.quarantine(final) if final.exists() else None
        os.rename(tmp, final)
        store.fsync_path(root)
    except OSError as e:
        return f"rank 0: committing {final.name}: {e.__class__.__name__}: {e}", None
    return None, replaced


def _cpu_contiguous(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu" and t.is_contiguous():
        return t  # the usual case, without the dispatcher's calls (tens of microseconds a tensor)
    return t.detach().to("cpu").contiguous()


def _json(body: object) -> bytes:
    return json.dumps(body, indent=1, sort_keys=True).encode()
