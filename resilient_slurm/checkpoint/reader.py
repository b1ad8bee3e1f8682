"""Reading boxes of a checkpoint's tensors into this rank's tensors, whatever layout wrote them.

A checkpoint holds each tensor as chunks (boxes: offsets and lengths per dimension, each in some
file; see layout.py). A reader is given destinations (a box of a tensor, into a CPU tensor of the
box's shape) and reads, for every saved chunk that overlaps one, only the bytes of the overlap:

- an overlap that is one contiguous run in both the chunk and the destination (a resume at the
  layout that saved, or cuts along dim 0 only) is read straight into the destination's memory;
- any other overlap (a column shard read from row shards) is generally not one byte range: the
  smallest contiguous run of the chunk that holds it is read into a scratch buffer, and the
  overlap copied out of it. Long runs are cut along their outer dimensions first, and scratch is
  used in batches of at most SCRATCH_BYTES, so memory stays bounded whatever the reshard.

A file whose every byte is wanted is read whole, in large parallel ranges straight into the
destinations, and its CRC checked; otherwise only the CRC chunks holding the wanted ranges are
read, each checked against the manifest's chunk CRCs. Version 1 checkpoints have no chunk CRCs:
their files are read whole and the rest is discarded.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.chunks import Box, intersect, is_contiguous, span, split_for_span, strides, uncovered, whole
from resilient_slurm.checkpoint.crc32 import crc32
from resilient_slurm.checkpoint.manifest import CHUNK_BYTES, Manifest
from resilient_slurm.checkpoint.parallel_io import InFile, read_files, read_ranges
from resilient_slurm.checkpoint.safetensors_io import DTYPES, Header, bytes_view, read_header

SCRATCH_BYTES = 64 << 20
"""At most this much scratch memory holds overlaps that are not one byte range, at a time."""


class LoadError(RuntimeError):
    """This checkpoint cannot be loaded into this run; the message says why."""


@dataclass(frozen=True)
class Saved:
    """One tensor as the checkpoint holds it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[tuple[str, Box], ...]
    """(file, box) of each chunk; together they tile the tensor (`verify` checks it)."""

    @property
    def itemsize(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


def saved_tensors(path: Path, prefix: str, manifest: Manifest, docs: dict[str, Any]) -> dict[str, Saved]:
    """Every tensor of `prefix` (model, optimizer) in the checkpoint, with its chunks; {} if none."""
    index = docs.get(layout.shards_file(prefix))
    if index is not None:
        try:
            return {name: Saved(tuple(int(d) for d in t["shape"]), DTYPES[t["dtype"]], tuple(layout.index_chunks(t)))
                    for name, t in index["tensors"].items()}
        except (KeyError, TypeError, ValueError) as e:
            raise LoadError(f"{layout.shards_file(prefix)} is malformed ({e.__class__.__name__}: {e})") from None
    # Version 1: whole tensors, in `<prefix>.safetensors` or the files of its HF-style index.
    single = f"{prefix}.safetensors"
    if single in manifest.files:
        files = [single]
    elif layout.index_file(prefix) in docs:
        files = sorted(set(docs[layout.index_file(prefix)]["weight_map"].values()))
    else:
        return {}
    out: dict[str, Saved] = {}
    for rel in files:
        for name, info in read_header(str(path / rel)).tensors.items():
            out[name] = Saved(info.shape, info.dtype, ((rel, whole(info.shape)),))
    return out


def overlapping(saved: Saved, box: Box) -> set[str]:
    """The files holding some of `box` of the tensor."""
    return {rel for rel, chunk in saved.chunks if intersect(chunk, box) is not None}


@dataclass
class _Span:
    offset: int
    dest: memoryview


@dataclass
class _Piece:
    """An overlap read through scratch: the chunk's elements [offset, offset + nbytes) as bytes of
    the file, then `dest` copied from them, seen with the chunk's strides."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dest: torch.Tensor


@dataclass
class _File:
    header: Header
    spans: list[_Span] = field(default_factory=list)
    pieces: list[_Piece] = field(default_factory=list)


class Reader:
    def __init__(self, path: Path, manifest: Manifest, io_threads: int) -> None:
        self.path = path
        self.manifest = manifest
        self.io_threads = io_threads
        self.files: dict[str, _File] = {}
        self.bytes_read = 0

    def add(self, name: str, saved: Saved, dest: torch.Tensor, box: Box, shape: tuple[int, ...] | None = None) -> None:
        """Fill `dest` (contiguous, on the CPU, the saved dtype, of the box's shape) with box `box`
        of tensor `name`; `shape`: the global shape of the tensor `dest` is part of, which must be
        the saved one."""
        if dest.dtype != saved.dtype or len(box.offsets) != len(saved.shape) or tuple(dest.shape) != box.lengths \
                or (box.volume and intersect(box, whole(saved.shape)) != box) or shape not in (None, saved.shape):
            raise LoadError(f"tensor {name!r}: the checkpoint has {saved.dtype}{list(saved.shape)}, this run needs "
                            f"{box.describe()} of it as {dest.dtype}{list(dest.shape)}")
        if not box.volume:
            return
        view = bytes_view(dest)
        item = saved.itemsize
        found = []
        for rel, chunk in saved.chunks:
            common = intersect(chunk, box)
            if common is None:
                continue
            info = self._file(rel).header.tensors.get(name)
            if info is None or info.dtype != saved.dtype or info.shape != chunk.lengths:
                raise LoadError(f"{rel} does not hold {chunk.describe()} of {name!r} as its shards index says")
            found.append(chunk)
            src = common.relative_to(chunk)
            shift = tuple(c - b for c, b in zip(chunk.offsets, box.offsets))
            for piece in split_for_span(src, chunk.lengths, max(1, SCRATCH_BYTES // item)):
                at = Box(tuple(o + s for o, s in zip(piece.offsets, shift)), piece.lengths)
                first, stop = span(piece, chunk.lengths)
                if is_contiguous(piece, chunk.lengths) and is_contiguous(at, box.lengths):
                    a, b = span(at, box.lengths)
                    self.files[rel].spans.append(_Span(info.begin + first * item, view[a * item : b * item]))
                else:
                    target = dest[tuple(slice(o, o + n) for o, n in zip(at.offsets, at.lengths))]
                    self.files[rel].pieces.append(_Piece(info.begin + first * item, (stop - first) * item, saved.dtype,
                                                         piece.lengths, strides(chunk.lengths), target))
        missing = uncovered(box, found)
        if missing is not None:
            raise LoadError(f"tensor {name!r}: no chunk of the checkpoint holds {missing.describe()} of it: its shards "
                            f"index does not cover the tensor (damaged or edited files)")

    def run(self) -> None:
        """Read everything added; LoadError on a short file or a checksum mismatch."""
        whole_files, partial = [], []
        for rel, f in self.files.items():
            wanted = sum(len(s.dest) for s in f.spans)
            entry = self.manifest.files[rel]
            if not f.pieces and (wanted == entry.nbytes - f.header.data_start
                                 or not (entry.chunks or entry.nbytes <= CHUNK_BYTES)):
                whole_files.append(rel)
            else:
                partial.append(rel)
        try:
            self._read_whole(whole_files)
            self._read_partial({rel: [(s.offset, s.dest) for s in self.files[rel].spans] for rel in partial})
            self._read_pieces(partial)
        except OSError as e:
            raise LoadError(str(e)) from None

    def _file(self, rel: str) -> _File:
        if rel not in self.files:
            if rel not in self.manifest.files:
                raise LoadError(f"the shards index names {rel}, which is not in the manifest")
            self.files[rel] = _File(read_header(str(self.path / rel)))
        return self.files[rel]

    def _read_whole(self, rels: list[str]) -> None:
        """Read each file whole, straight into the spans (scratch for the bytes no span wants)."""
        ins = []
        for rel in rels:
            f = self.files[rel]
            segments: list[memoryview] = []
            pos = 0
            for s in sorted(f.spans, key=lambda s: s.offset):
                if s.offset > pos:
                    segments.append(memoryview(bytearray(s.offset - pos)))
                segments.append(s.dest)
                pos = s.offset + len(s.dest)
            size = self.manifest.files[rel].nbytes
            if size > pos:
                segments.append(memoryview(bytearray(size - pos)))
            ins.append(InFile(str(self.path / rel), segments))
        for rel, crc in zip(rels, read_files(ins, self.io_threads)):
            self.bytes_read += self.manifest.files[rel].nbytes
            if crc != self.manifest.files[rel].crc32:
                raise LoadError(f"checksum mismatch in {rel}")

    def _read_partial(self, spans: dict[str, list[tuple[int, memoryview]]]) -> None:
        """The CRC chunks holding each file's spans, checked, copied into them."""
        def one(rel: str) -> int:
            entry = self.manifest.files[rel]
            if entry.chunks or entry.nbytes <= CHUNK_BYTES:
                return read_ranges(str(self.path / rel), entry.nbytes, entry.chunks or (entry.crc32,), spans[rel])
            # Version 1: one CRC for the whole file, so all of it is read to check any of it.
            data = memoryview(bytearray(entry.nbytes))
            if read_files([InFile(str(self.path / rel), [data])], 1)[0] != entry.crc32:
                raise LoadError(f"checksum mismatch in {rel}")
            for offset, dest in spans[rel]:
                dest[:] = data[offset : offset + len(dest)]
            return entry.nbytes

        todo = [rel for rel, s in spans.items() if s]
        with ThreadPoolExecutor(max_workers=max(1, min(self.io_threads, len(todo) or 1))) as pool:
            for n in pool.map(one, todo):
                self.bytes_read += n

    def _read_pieces(self, rels: list[str]) -> None:
        """Overlaps through scratch, SCRATCH_BYTES at a time: read their runs, copy them out."""
        pending = [(rel, p) for rel in rels for p in self.files[rel].pieces]
        while pending:
            batch: list[tuple[str, _Piece]] = []
            size = 0
            while pending and (not batch or size + pending[0][1].nbytes <= SCRATCH_BYTES):
                batch.append(pending.pop(0))
                size += batch[-1][1].nbytes
            scratch = [torch.empty(p.nbytes, dtype=torch.uint8) for _, p in batch]
            spans: dict[str, list[tuple[int, memoryview]]] = {}
            for (rel, p), buf in zip(batch, scratch):
                spans.setdefault(rel, []).append((p.offset, bytes_view(buf)))
            self._read_partial(spans)
            for (_, p), buf in zip(batch, scratch):
                p.dest.copy_(buf.view(p.dtype).as_strided(p.shape, p.strides))


def read_json(path: Path, rel: str, manifest: Manifest) -> Any:
    """A small JSON file of the checkpoint, checked against its CRC."""
    raw = (path / rel).read_bytes()
    if crc32(raw) != manifest.files[rel].crc32:
        raise LoadError(f"checksum mismatch in {rel}")
    return json.loads(raw)
