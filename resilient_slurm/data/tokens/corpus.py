"""Token files read where they lie: Megatron `.bin/.idx` prefixes and headerless token arrays.

Every read is one `os.pread` of the tokens it needs, on a descriptor opened the first time that file
is read (at most OPEN_FILES at once, least recently used closed first): nothing is mapped per
sample, no file is read whole, and a rank opens only the files its own windows fall in. Opening a
file reads its header and the last entries of its index, so a pair that does not belong together
(a truncated or foreign `.bin`) is refused at once; the full scan (every token below the vocabulary,
sequences stored back to back) is `scan`, run once when the order index is built.

Headerless arrays are what OLMo-core and dolma write (`.npy`-named, no numpy header, uint16 or
uint32 tokens, documents separated by EOS), so their dtype must be declared; a file that does carry
a numpy header is read through it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np

from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.idx_format import HEADER_BYTES, parse_header

OPEN_FILES = 256
"""Descriptors kept open per process (clusters often allow 1,024)."""
ARRAY_DTYPES = ("uint16", "uint32", "int32", "int64")
NUMPY_MAGIC = b"\x93NUMPY"
_SCAN_CHUNK = 1 << 26


class _Descriptors:
    """Open files by path, least recently used closed first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[str, int] = OrderedDict()
        self._pid = os.getpid()

    def pread(self, path: str, size: int, offset: int) -> bytes:
        if os.getpid() != self._pid:  # a forked worker: the parent's offsets are shared, its fds too
            self._open.clear()
            self._pid = os.getpid()
        fd = self._open.pop(path, None)
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            if len(self._open) >= self.limit:
                os.close(self._open.popitem(last=False)[1])
        self._open[path] = fd
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise TokenDataError(f"{path}: short read ({len(data)} of {size} bytes at {offset}); the file shrank "
                                 "while in use; restore it")
        return data


FILES = _Descriptors(OPEN_FILES)


class TokenFile(Protocol):
    path: str
    dtype: str
    num_tokens: int

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the file."""

    def doc_starts(self, start: int, tokens: np.ndarray) -> np.ndarray:
        """Offsets j in (0, len(tokens)) at which a document begins, for `tokens` read at `start`."""

    def identity(self) -> dict[str, Any]:
        """What the fingerprint records: the file's name and size and what its header says."""

    def scan(self) -> int:
        """Read every token once: the largest id (TokenDataError on a negative one or a bad layout)."""


def _size(path: str, what: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise TokenDataError(f"{path}: missing; {what}") from None


class MegatronFile:
    """One Megatron indexed dataset (a `.bin` and its `.idx`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.idx, self.path = prefix + ".idx", prefix + ".bin"
        idx_bytes = _size(self.idx, f"a Megatron dataset needs both {prefix}.bin and {prefix}.idx")
        bin_bytes = _size(self.path, f"a Megatron dataset needs both {prefix}.bin and {prefix}.idx")
        self.header = h = parse_header(FILES.pread(self.idx, min(idx_bytes, HEADER_BYTES), 0), self.idx)
        if not h.sizes_ok(idx_bytes):
            raise TokenDataError(
                f"{self.idx}: {idx_bytes} bytes, but its header ({h.sequences} sequences, {h.documents} document "
                f"entries) needs {HEADER_BYTES + 12 * h.sequences + 8 * h.documents}; the file is truncated; rewrite it")
        self.dtype = h.dtype
        end = 0
        if h.sequences:
            (length,) = np.frombuffer(FILES.pread(self.idx, 4, h.pointers_offset - 4), np.int32)
            (pointer,) = np.frombuffer(FILES.pread(self.idx, 8, h.documents_offset - 8), np.int64)
            end = int(pointer) + int(length) * h.itemsize
        if end != bin_bytes:
            raise TokenDataError(f"{self.path}: {bin_bytes} bytes, but {self.idx} says its sequences end at byte "
                                 f"{end}; the .idx does not belong to this .bin (or one is truncated); rewrite the pair")
        self.num_tokens = bin_bytes // h.itemsize
        self._pointers: np.ndarray | None = None
        self._documents: np.ndarray | None = None

    def read(self, start: int, stop: int) -> np.ndarray:
        isz = self.header.itemsize
        return np.frombuffer(FILES.pread(self.path, (stop - start) * isz, start * isz), self.dtype)

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._pointers is None or self._documents is None:
            h = self.header
            self._pointers = np.memmap(self.idx, np.int64, "r", h.pointers_offset, (h.sequences,))
            self._documents = np.memmap(self.idx, np.int64, "r", h.documents_offset, (h.documents,))
        return self._pointers, self._documents

    def doc_starts(self, start: int, tokens: np.ndarray) -> np.ndarray:
        if self.header.sequences == 0:
            return np.empty(0, np.int64)
        pointers, documents = self._index()
        isz = self.header.itemsize
        lo = int(np.searchsorted(pointers, start * isz, "right"))
        hi = int(np.searchsorted(pointers, (start + len(tokens)) * isz, "left"))
        seqs = np.arange(lo, hi)
        at = np.minimum(np.searchsorted(documents, seqs), len(documents) - 1)
        first = seqs[documents[at] == seqs]  # sequences that begin a document (not a later sentence)
        return np.unique(np.asarray(pointers[first]) // isz - start)

    def identity(self) -> dict[str, Any]:
        return {"file": os.path.basename(self.path), "bytes": self.num_tokens * self.header.itemsize,
                "format": "megatron", "dtype": self.dtype, "sequences": self.header.sequences,
                "documents": self.header.documents}

    def scan(self) -> int:
        h = self.header
        lengths = np.memmap(self.idx, np.int32, "r", h.lengths_offset, (h.sequences,)) if h.sequences else None
        pointers, _ = self._index() if h.sequences else (None, None)
        expected = 0
        for lo in range(0, h.sequences, _SCAN_CHUNK):
            assert lengths is not None and pointers is not None
            hi = min(lo + _SCAN_CHUNK, h.sequences)
            starts = expected + np.concatenate(([0], np.cumsum(lengths[lo:hi - 1], dtype=np.int64))) * h.itemsize
            bad = np.flatnonzero(starts != pointers[lo:hi])
            if bad.size:
                i = int(bad[0])
                raise TokenDataError(f"{self.idx}: sequence {lo + i} starts at byte {int(pointers[lo + i])}, not "
                                     f"{int(starts[i])}: the sequences are not stored back to back; rewrite the pair "
                                     "(python -m resilient_slurm.data tokenize, or Megatron's tools/merge_datasets.py)")
            expected = int(starts[-1]) + int(lengths[hi - 1]) * h.itemsize
        return _scan_tokens(self.path, self.dtype, 0, self.num_tokens)


class ArrayFile:
    """A flat token array: headerless (dtype declared), or a `.npy` with its numpy header."""

    def __init__(self, path: str, dtype: str | None, eos_id: int | None) -> None:
        self.path = path
        size = _size(path, "point the source at an existing file")
        with open(path, "rb") as f:
            if f.read(len(NUMPY_MAGIC)) == NUMPY_MAGIC:
                f.seek(0)
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, header_dtype = read_header(f)
                self.offset = f.tell()
                found = np.dtype(header_dtype).name
                if dtype is not None and dtype != found:
                    raise TokenDataError(f"{path}: its numpy header says {found}, the source declares dtype {dtype}; "
                                         "remove the source's dtype or fix it")
                if fortran and len(shape) > 1:
                    raise TokenDataError(f"{path}: a Fortran-ordered {shape} array; save the tokens as a flat array")
                dtype = found
            else:
                self.offset = 0
        if dtype is None:
            raise TokenDataError(f"{path}: a headerless token array needs its dtype; set dtype (uint16 or uint32) "
                                 "on its source")
        if dtype not in ARRAY_DTYPES:
            raise TokenDataError(f"{path}: dtype {dtype} is not a token type; use one of {', '.join(ARRAY_DTYPES)}")
        self.dtype = dtype
        isz = np.dtype(dtype).itemsize
        if (size - self.offset) % isz:
            raise TokenDataError(f"{path}: {size - self.offset} bytes of tokens is not a multiple of {isz} ({dtype}); "
                                 "the file is truncated or its dtype is another")
        self.num_tokens = (size - self.offset) // isz
        self.eos_id = eos_id

    def read(self, start: int, stop: int) -> np.ndarray:
        isz = np.dtype(self.dtype).itemsize
        return np.frombuffer(FILES.pread(self.path, (stop - start) * isz, self.offset + start * isz), self.dtype)

    def doc_starts(self, start: int, tokens: np.ndarray) -> np.ndarray:
        if self.eos_id is None:
            return np.empty(0, np.int64)
        return np.flatnonzero(tokens[:-1] == self.eos_id) + 1

    def identity(self) -> dict[str, Any]:
        return {"file": os.path.basename(self.path), "bytes": self.num_tokens * np.dtype(self.dtype).itemsize,
                "format": "array", "dtype": self.dtype}

    def scan(self) -> int:
        return _scan_tokens(self.path, self.dtype, self.offset, self.num_tokens)


def _scan_tokens(path: str, dtype: str, offset: int, count: int) -> int:
    if count == 0:
        return -1
    tokens = np.memmap(path, dtype, "r", offset, (count,))
    low, high = None, None
    for lo in range(0, count, _SCAN_CHUNK):
        chunk = tokens[lo:lo + _SCAN_CHUNK]
        c_low, c_high = int(chunk.min()), int(chunk.max())
        low = c_low if low is None else min(low, c_low)
        high = c_high if high is None else max(high, c_high)
    assert low is not None and high is not None
    if low < 0:
        raise TokenDataError(f"{path}: negative token id {low}; the file is not tokens of dtype {dtype}")
    return high


def open_token_file(path: str, dtype: str | None = None, eos_id: int | None = None) -> TokenFile:
    """A Megatron prefix (`path` without .bin/.idx, or either file), or an array file."""
    for suffix in (".idx", ".bin"):
        if path.endswith(suffix):
            return MegatronFile(path[: -len(suffix)])
    if os.path.exists(path + ".idx") or os.path.exists(path + ".bin"):
        return MegatronFile(path)
    return ArrayFile(path, dtype, eos_id)

