"""Which rank writes which chunk of which tensor, into which file. Pure.

Every rank describes what it holds (`Holding`): for each tensor its global spec and either "whole"
(a plain tensor) or the mesh and placements of its DTensor. The description names no rank of its
own, so the ranks of one pipeline stage (or of a plain data-parallel run) describe the same thing;
the save exchanges each distinct description once, with the ranks that have it (`save.py`), and
every rank derives the same plan from that:

1. each holder's box of each tensor (`chunks.shard_box` at the holder's mesh coordinate);
2. the distinct chunks (tensor, box) and their holders: replicas (a Replicate axis, an HSDP
   replica, a plain tensor on every rank) hold the same chunk;
3. the chunks of every tensor must tile it exactly, and every description of a tensor must agree
   on its shape and dtype;
4. each chunk is written once, by one of its holders: chunks with the fewest holders first, larger
   first, each to the holder with the fewest bytes so far (Megatron's fully parallel save does the
   same), so replicas share the writing and its bandwidth;
5. each rank's chunks, in its own state order, are cut into files of at most `max_shard_bytes`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from resilient_slurm.checkpoint.chunks import Box, ChunkError, Placement, shard_box, tiling_gap, whole
from resilient_slurm.checkpoint.layout import Chunk, ChunkFile, TensorSpec


class PlanError(ValueError):
    """The ranks' states do not make a checkpoint (a tensor nobody holds all of, two shapes for one
    name, a placement no box describes); the message names the tensor."""


@dataclass(frozen=True)
class Mesh:
    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    """Global ranks in row-major order of the mesh."""

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        try:
            flat = self.ranks.index(rank)
        except ValueError:
            return None
        out = []
        for n in reversed(self.shape):
            out.append(flat % n)
            flat //= n
        return tuple(reversed(out))


@dataclass(frozen=True)
class Entry:
    spec: TensorSpec
    mesh: int | None = None
    """Index into `Holding.meshes` of the DTensor's mesh; None: a plain tensor, held whole."""
    placements: tuple[Placement, ...] = ()


@dataclass(frozen=True)
class Holding:
    """What one rank holds of the state, in terms any rank can evaluate for any holder."""

    tensors: tuple[tuple[str, tuple[Entry, ...]], ...]
    """(prefix, its entries in state order) for model and optimizer."""
    meshes: tuple[Mesh, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    """The parameter names of each of the optimizer's param groups."""
    optimizer: str | None = None
    """The optimizer's class name; None without one."""


@dataclass(frozen=True)
class Plan:
    specs: dict[str, list[TensorSpec]]
    files: dict[str, list[ChunkFile]]
    groups: tuple[tuple[tuple[str, ...], int, int], ...]
    """Each distinct param group: its names, and (rank, group index) of a rank that has it, whose
    hyper-parameters the save records."""
    optimizer: str | None
    digest: str

    def rank_files(self, rank: int) -> list[tuple[str, ChunkFile]]:
        return [(prefix, f) for prefix, files in self.files.items() for f in files if f.rank == rank]


def plan(classes: list[tuple[Holding, tuple[int, ...]]], max_shard_bytes: int) -> Plan:
    """The save's plan from each distinct holding and the ranks that have it (ascending)."""
    specs: dict[str, dict[str, TensorSpec]] = {}
    holders: dict[tuple[str, str, Box], list[int]] = {}
    boxes_of: dict[int, dict[tuple[str, str], Box]] = {}
    cache: dict[tuple, dict[int, Box]] = {}
    for holding, ranks in classes:
        for prefix, entries in holding.tensors:
            known = specs.setdefault(prefix, {})
            for e in entries:
                seen = known.setdefault(e.spec.name, e.spec)
                if (seen.shape, seen.dtype) != (e.spec.shape, e.spec.dtype):
                    raise PlanError(f"{prefix} tensor {e.spec.name!r} is {e.spec.dtype}{list(e.spec.shape)} on rank "
                                    f"{ranks[0]} but {seen.dtype}{list(seen.shape)} on another: ranks disagree on it")
                for rank, box in _boxes(holding, e, ranks, cache).items():
                    boxes_of.setdefault(rank, {})[(prefix, e.spec.name)] = box
                    if box.volume:
                        holders.setdefault((prefix, e.spec.name, box), []).append(rank)
    by_tensor: dict[tuple[str, str], list[Box]] = {}
    for prefix, name, box in holders:
        by_tensor.setdefault((prefix, name), []).append(box)
    for prefix, named in specs.items():
        for name, spec in named.items():
            gap = tiling_gap(spec.shape, by_tensor.get((prefix, name), []))
            if gap:
                raise PlanError(f"{prefix} tensor {name!r} {list(spec.shape)}: {gap} among what the ranks hold; "
                                f"every part of a tensor must be registered on some rank")
    writer = assign(holders, {(p, n): s.itemsize for p, named in specs.items() for n, s in named.items()})
    files = {prefix: _files(prefix, classes, boxes_of, writer, specs[prefix], max_shard_bytes) for prefix in specs}
    groups: dict[tuple[str, ...], tuple[int, int]] = {}
    for holding, ranks in classes:
        for i, names in enumerate(holding.groups):
            groups.setdefault(names, (ranks[0], i))
    optimizer = next((h.optimizer for h, _ in classes if h.optimizer), None)
    digest = hashlib.sha256(repr((files, sorted(groups.items()))).encode()).hexdigest()
    return Plan({p: list(named.values()) for p, named in specs.items()}, files,
                tuple((names, r, i) for names, (r, i) in groups.items()), optimizer, digest)


def _boxes(holding: Holding, e: Entry, ranks: tuple[int, ...], cache: dict[tuple, dict[int, Box]]) -> dict[int, Box]:
    if e.mesh is None:
        return {r: whole(e.spec.shape) for r in ranks}
    mesh = holding.meshes[e.mesh]
    key = (e.spec.shape, e.placements, mesh, ranks)
    if key not in cache:
        out = {}
        for r in ranks:
            coord = mesh.coordinate(r)
            if coord is None:
                raise PlanError(f"tensor {e.spec.name!r}: rank {r} holds it on a mesh of ranks {list(mesh.ranks)}, "
                                f"which it is not part of")
            try:
                out[r] = shard_box(e.spec.shape, mesh.shape, coord, e.placements)
            except ChunkError as err:
                raise PlanError(f"tensor {e.spec.name!r}: {err}; save it with placements that leave each rank one "
                                f"box (FSDP2 over TP does)") from None
        cache[key] = out
    return cache[key]


def assign(holders: dict[tuple[str, str, Box], list[int]], itemsize: dict[tuple[str, str], int]) -> dict:
    """chunk -> the rank that writes it: fewest holders first, then larger, each to the holder
    with the fewest bytes assigned so far (the lowest rank among equals)."""
    load: dict[int, int] = {}
    out = {}

    def order(item: tuple[tuple[str, str, Box], list[int]]) -> tuple:
        (prefix, name, box), ranks = item
        return len(ranks), -box.volume * itemsize[(prefix, name)], prefix, name, box.offsets

    for key, ranks in sorted(holders.items(), key=order):
        rank = min(ranks, key=lambda r: (load.get(r, 0), r))
        out[key] = rank
        load[rank] = load.get(rank, 0) + key[2].volume * itemsize[(key[0], key[1])]
    return out


def _files(prefix: str, classes: list[tuple[Holding, tuple[int, ...]]], boxes_of: dict[int, dict[tuple[str, str], Box]],
           writer: dict, specs: dict[str, TensorSpec], max_shard_bytes: int) -> list[ChunkFile]:
    """Each rank's chunks of `prefix`, in its state order, cut into files; numbered over all ranks."""
    order = {r: holding for holding, ranks in classes for r in ranks}
    runs: list[tuple[int, list[Chunk]]] = []
    for rank in sorted(order):
        entries = dict(order[rank].tensors).get(prefix, ())
        current: list[Chunk] = []
        size = 0
        for e in entries:
            box = boxes_of[rank][(prefix, e.spec.name)]
            if not box.volume or writer.get((prefix, e.spec.name, box)) != rank:
                continue
            nbytes = box.volume * specs[e.spec.name].itemsize
            if current and size + nbytes > max_shard_bytes:
                runs.append((rank, current))
                current, size = [], 0
            current.append(Chunk(e.spec.name, box))
            size += nbytes
        if current:
            runs.append((rank, current))
    if len(runs) == 1:
        return [ChunkFile(f"{prefix}.safetensors", runs[0][0], tuple(runs[0][1]))]
    return [ChunkFile(f"{prefix}-{i + 1:05d}-of-{len(runs):05d}.safetensors", rank, tuple(chunks))
            for i, (rank, chunks) in enumerate(runs)]
