"""Reading rows of a checkpoint's tensors into this rank's tensors, whatever world size wrote them.

A checkpoint holds each tensor as pieces (rows [start, stop) of dim 0, each in some file; see
layout.py). A reader is given destinations (rows [a, b) of a tensor, into a CPU tensor) and reads
only the byte ranges of the pieces that overlap them: a row range is one contiguous byte range.
A file whose every byte is wanted (a resume at the world size that wrote it) is read whole, in
large parallel ranges straight into the destinations, and its CRC checked; otherwise only the
chunks holding the wanted ranges are read, each checked against the manifest's chunk CRCs.
Version 1 checkpoints have no chunk CRCs: their files are read whole and the rest is discarded.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.crc32 import crc32
from resilient_slurm.checkpoint.manifest import CHUNK_BYTES, Manifest
from resilient_slurm.checkpoint.parallel_io import InFile, read_files, read_ranges
from resilient_slurm.checkpoint.safetensors_io import DTYPES, Header, bytes_view, read_header


class LoadError(RuntimeError):
    """This checkpoint cannot be loaded into this run; the message says why."""


@dataclass(frozen=True)
class Saved:
    """One tensor as the checkpoint holds it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: tuple[tuple[str, int, int], ...]
    """(file, start row, stop row), covering every row once."""

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        n = torch.empty(0, dtype=self.dtype).element_size()
        for d in self.shape[1:]:
            n *= d
        return n


def saved_tensors(path: Path, prefix: str, manifest: Manifest, docs: dict[str, Any]) -> dict[str, Saved]:
    """Every tensor of `prefix` (model, optimizer) in the checkpoint, with its pieces; {} if none."""
    index = docs.get(layout.shards_file(prefix))
    if index is not None:
        try:
            return {name: Saved(tuple(t["shape"]), DTYPES[t["dtype"]], tuple((f, int(a), int(b)) for f, a, b in t["pieces"]))
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
            out[name] = Saved(info.shape, info.dtype, ((rel, 0, info.shape[0] if info.shape else 1),))
    return out


@dataclass
class _Span:
    offset: int
    dest: memoryview


@dataclass
class _File:
    header: Header
    spans: list[_Span] = field(default_factory=list)


class Reader:
    def __init__(self, path: Path, manifest: Manifest, io_threads: int) -> None:
        self.path = path
        self.manifest = manifest
        self.io_threads = io_threads
        self.files: dict[str, _File] = {}
        self.bytes_read = 0

    def add(self, name: str, saved: Saved, dest: torch.Tensor, start: int) -> None:
        """Fill `dest` (contiguous, on the CPU, the saved dtype) with rows [start, start + len) of
        tensor `name`."""
        rows = dest.shape[0] if dest.ndim else 1
        if dest.dtype != saved.dtype or tuple(dest.shape[1:]) != saved.shape[1:] or start + rows > saved.rows:
            raise LoadError(f"tensor {name!r}: the checkpoint has {saved.dtype}{list(saved.shape)}, this run needs "
                            f"rows {start}..{start + rows} of {dest.dtype}{[None, *dest.shape[1:]]}")
        view = bytes_view(dest)
        covered = 0
        for rel, a, b in saved.pieces:
            lo, hi = max(a, start), min(b, start + rows)
            if lo >= hi:
                continue
            info = self._file(rel).header.tensors.get(name)
            if info is None or info.dtype != saved.dtype or (info.shape[0] if info.shape else 1) != b - a:
                raise LoadError(f"{rel} does not hold rows {a}..{b} of {name!r} as its shards index says")
            offset = info.begin + (lo - a) * saved.row_bytes
            self.files[rel].spans.append(
                _Span(offset, view[(lo - start) * saved.row_bytes : (hi - start) * saved.row_bytes]))
            covered += hi - lo
        if covered != rows:
            raise LoadError(f"checkpoint lacks rows of {name!r}: {covered} of the {rows} needed here")

    def run(self) -> None:
        """Read every span added; LoadError on a short file or a checksum mismatch."""
        whole, partial = [], []
        for rel, f in self.files.items():
            wanted = sum(len(s.dest) for s in f.spans)
            entry = self.manifest.files[rel]
            if wanted == entry.nbytes - f.header.data_start or not (entry.chunks or entry.nbytes <= CHUNK_BYTES):
                whole.append(rel)
            else:
                partial.append(rel)
        try:
            self._read_whole(whole)
            with ThreadPoolExecutor(max_workers=max(1, min(self.io_threads, len(partial) or 1))) as pool:
                for n in pool.map(self._read_partial, partial):
                    self.bytes_read += n
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
            for span in sorted(f.spans, key=lambda s: s.offset):
                if span.offset > pos:
                    segments.append(memoryview(bytearray(span.offset - pos)))
                segments.append(span.dest)
                pos = span.offset + len(span.dest)
            size = self.manifest.files[rel].nbytes
            if size > pos:
                segments.append(memoryview(bytearray(size - pos)))
            ins.append(InFile(str(self.path / rel), segments))
        for rel, crc in zip(rels, read_files(ins, self.io_threads)):
            self.bytes_read += self.manifest.files[rel].nbytes
            if crc != self.manifest.files[rel].crc32:
                raise LoadError(f"checksum mismatch in {rel}")

    def _read_partial(self, rel: str) -> int:
        entry = self.manifest.files[rel]
        chunks = entry.chunks or (entry.crc32,)
        return read_ranges(str(self.path / rel), entry.nbytes, chunks,
                           [(s.offset, s.dest) for s in self.files[rel].spans])


def read_json(path: Path, rel: str, manifest: Manifest) -> Any:
    """A small JSON file of the checkpoint, checked against its CRC."""
    raw = (path / rel).read_bytes()
    if crc32(raw) != manifest.files[rel].crc32:
        raise LoadError(f"checksum mismatch in {rel}")
    return json.loads(raw)
