"""Large sequential file I/O spread over threads, with the CRC32 of every byte on the way.

A file is a list of byte segments in file order: a header, then each tensor's own memory. Each
file is cut into `TASK`-sized byte ranges and one pool of threads works through the ranges of all
files together, so one 1 GB shard is not left to a single thread while the others idle. Every
range's CRC is combined into the file's CRC afterwards (`crc32.combine_all`), which is the value
`zlib.crc32` of the whole file would give. Writes also keep the CRC of every CHUNK_BYTES chunk (the
manifest lists them), so `read_ranges` can check a few ranges of a file without reading the rest.

Writes go through O_DIRECT with page-aligned buffers: measured on our machines, that writes about
twice as fast as page-cache writes plus fsync, and steadier, and it leaves the page cache to
training. Tensor memory is not page-aligned, so it is copied through a reused aligned
buffer per thread; a staged file image (`OutFile.aligned`) is already aligned and is written
straight from memory. Filesystems without O_DIRECT (tmpfs, some FUSE) get plain writes.

Reads are buffered `preadv` straight into the caller's tensors (no intermediate copy), with the
kernel's readahead: measured here after a cache drop, O_DIRECT reads through a reused aligned
buffer took 1.6x as long (no readahead), and mmap plus a copy 1.4x.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from resilient_slurm.checkpoint.crc32 import combine_all, crc32
from resilient_slurm.checkpoint.manifest import CHUNK_BYTES

BLOCK = 4096
"""O_DIRECT alignment of buffer addresses, file offsets and lengths."""
TASK = 64 << 20
"""Bytes of one file range handed to a thread (a multiple of BLOCK)."""
CHUNK = 32 << 20
"""Size of the per-thread aligned buffer that tensor bytes are gathered into before a write: one
direct write each. Measured here against 8 MiB, in one rotation with dd: 0.86 of dd's speed
against 0.57 (fewer writes, and fewer hand-offs of the GIL between the writer threads)."""
_IOV_MAX = 1024

_T = TypeVar("_T")
_R = TypeVar("_R")


class ShortFileError(OSError):
    """A file ended before the bytes its header promised."""


@dataclass(frozen=True)
class FileDigest:
    nbytes: int
    crc32: int
    chunks: tuple[int, ...] = ()
    """CRC32 of each CHUNK_BYTES of the file (empty when the file is one chunk or less)."""


Part = tuple[int, int, int]
"""(chunk index, CRC32, length) of some consecutive bytes of a file that lie in one chunk."""


def chunk_parts(data: memoryview, offset: int, parts: list[Part]) -> None:
    """Append the CRCs of `data` (file bytes from `offset`), cut at the file's chunk boundaries."""
    pos = 0
    while pos < len(data):
        index = (offset + pos) // CHUNK_BYTES
        n = min(len(data) - pos, (index + 1) * CHUNK_BYTES - (offset + pos))
        parts.append((index, crc32(data[pos : pos + n]), n))
        pos += n


def digest(nbytes: int, parts: list[Part]) -> FileDigest:
    """A file's digest from the CRCs of all its bytes, as parts in file order."""
    chunks: list[tuple[int, int]] = []  # (crc, length) of each chunk
    for index, crc, n in parts:
        if index < len(chunks):
            chunks[index] = (combine_all([chunks[index], (crc, n)]), chunks[index][1] + n)
        else:
            chunks.append((crc, n))
    crc = combine_all(chunks)
    return FileDigest(nbytes, crc, tuple(c for c, _ in chunks) if len(chunks) > 1 else ())


@dataclass(frozen=True)
class OutFile:
    path: str
    segments: Sequence[memoryview]
    """The file's bytes in order; each a 1-D unsigned-byte view."""
    aligned: memoryview | None = None
    """The same bytes as one page-aligned buffer that extends to the next BLOCK boundary (a staged
    file image): written straight from memory, without the bounce copy."""

    @property
    def nbytes(self) -> int:
        return sum(len(s) for s in self.segments)


@dataclass(frozen=True)
class InFile:
    path: str
    segments: Sequence[memoryview]
    """Writable views that together receive every byte of the file, in order."""


def round_up(n: int, block: int = BLOCK) -> int:
    return -(-n // block) * block


def write_files(files: Sequence[OutFile], threads: int, direct: bool = True) -> list[FileDigest]:
    """Create each file (it must not exist), write it, fsync it; digests in the same order.

    `direct=False` writes through the page cache straight from the segments, without the bounce
    copy: for files in memory (tmpfs), where there is no disk to bypass."""
    fds: list[int] = []
    try:
        for f in files:
            fds.append(_open_new(f.path, direct))
        ranges = [(i, start, min(start + TASK, f.nbytes)) for i, f in enumerate(files)
                  for start in range(0, f.nbytes, TASK)]
        write = _write_range if direct else _write_range_buffered
        chunks = _run(threads, lambda r: write(files[r[0]], fds[r[0]], r[1], r[2]), ranges)

        def finish(i: int) -> None:
            if files[i].nbytes % BLOCK:
                # Direct writes were padded to whole blocks: cut the file back to its size.
                os.ftruncate(fds[i], files[i].nbytes)
            os.fsync(fds[i])

        _run(threads, finish, list(range(len(files))))
    finally:
        for fd in fds:
            os.close(fd)
    per_file: list[list[Part]] = [[] for _ in files]
    for (i, _, _), parts in zip(ranges, chunks):
        per_file[i].extend(parts)  # ranges are in file order within each file
    return [digest(f.nbytes, c) for f, c in zip(files, per_file)]


def read_files(files: Sequence[InFile], threads: int) -> list[int]:
    """Fill every file's segments from the file; the CRC32 of each whole file, in order."""
    fds: list[int] = []
    try:
        for f in files:
            fd = os.open(f.path, os.O_RDONLY)
            fds.append(fd)
            # Large reads with sequential readahead: measured here, 64 MiB reads on a cold cache
            # ran 1.7x faster than 8 MiB ones.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        sizes = [sum(len(s) for s in f.segments) for f in files]
        ranges = [(i, start, min(start + TASK, n)) for i, n in enumerate(sizes) for start in range(0, n, TASK)]
        crcs = _run(threads, lambda r: _read_range(files[r[0]], fds[r[0]], r[1], r[2]), ranges)
    finally:
        for fd in fds:
            os.close(fd)
    return _file_crcs(len(files), ranges, crcs)


def _file_crcs(n: int, ranges: list[tuple[int, int, int]], crcs: list[int]) -> list[int]:
    """Each file's CRC32 from the CRCs of its (file, start, end) ranges."""
    parts: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for (i, start, end), crc in zip(ranges, crcs):
        parts[i].append((crc, end - start))
    return [combine_all(p) for p in parts]


def _run(threads: int, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    if len(items) <= 1 or threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


def _open_new(path: str, direct: bool = True) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if not direct:
        return os.open(path, flags, 0o644)
    try:
        return os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, flags, 0o644)


def _write_range(f: OutFile, fd: int, start: int, end: int) -> list[Part]:
    """Write file bytes [start, end) at their offset; their CRCs, by chunk."""
    parts: list[Part] = []
    if f.aligned is not None:
        chunk_parts(f.aligned[start:end], start, parts)
        _pwrite(fd, f.aligned[start : round_up(end)], start)
        return parts
    with _bounce() as buf:
        starts = _segment_starts(f.segments)
        pos = start
        while pos < end:
            n = min(CHUNK, end - pos)
            _gather(f.segments, starts, pos, buf[:n])
            chunk_parts(buf[:n], pos, parts)
            padded = round_up(n)
            buf[n:padded] = bytes(padded - n)
            _pwrite(fd, buf[:padded], pos)
            pos += n
    return parts


def _write_range_buffered(f: OutFile, fd: int, start: int, end: int) -> list[Part]:
    """`_write_range` for a file opened without O_DIRECT: each segment's own bytes, no copy of ours."""
    parts: list[Part] = []
    pos = start
    for view in _slices(f.segments, _segment_starts(f.segments), start, end):
        chunk_parts(view, pos, parts)
        _pwrite(fd, view, pos)
        pos += len(view)
    return parts


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    while data:
        try:
            written = os.pwrite(fd, data, offset)
        except OSError as e:
            if e.errno != errno.EINVAL or not fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
                raise
            # The filesystem accepted O_DIRECT at open but not for writes: carry on buffered.
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            continue
        data = data[written:]
        offset += written


def _read_range(f: InFile, fd: int, start: int, end: int) -> int:
    views = _slices(f.segments, _segment_starts(f.segments), start, end)
    crc = 0
    pos = start
    for batch_start in range(0, len(views), _IOV_MAX):
        pending = [v for v in views[batch_start : batch_start + _IOV_MAX] if len(v)]
        while pending:
            n = os.preadv(fd, pending, pos)
            if n == 0:
                raise ShortFileError(errno.EIO, f"{f.path} ends at byte {pos}, before the end of its data")
            pos += n
            while pending and n >= len(pending[0]):
                n -= len(pending[0])
                pending.pop(0)
            if n:
                pending[0] = pending[0][n:]
    for v in views:
        crc = crc32(v, crc)
    return crc


def _segment_starts(segments: Sequence[memoryview]) -> list[int]:
    starts, pos = [], 0
    for s in segments:
        starts.append(pos)
        pos += len(s)
    return starts


def _slices(segments: Sequence[memoryview], starts: list[int], start: int, end: int) -> list[memoryview]:
    """Views of the segments covering file bytes [start, end)."""
    out = []
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    while i < len(segments) and starts[i] < end:
        seg = segments[i]
        lo = max(start - starts[i], 0)
        hi = min(end - starts[i], len(seg))
        if hi > lo:
            out.append(seg[lo:hi])
        i += 1
    return out


def _gather(segments: Sequence[memoryview], starts: list[int], start: int, dst: memoryview) -> None:
    out: Any = np.frombuffer(dst, dtype=np.uint8)
    pos = 0
    for part in _slices(segments, starts, start, start + len(dst)):
        # numpy copies without the GIL, which a memoryview slice assignment holds: with the writer
        # threads queueing for it, measured here, the disk sat idle between their writes.
        np.copyto(out[pos : pos + len(part)], np.frombuffer(part, dtype=np.uint8))
        pos += len(part)


class _bounce:
    """A page-aligned CHUNK buffer from a process-wide free list: allocated once per thread that
    ever needs one and reused by every later save, because fresh memory is slow to touch here."""

    _free: list[mmap.mmap] = []
    _lock = threading.Lock()

    def __enter__(self) -> memoryview:
        with self._lock:
            fits = [b for b in self._free if len(b) == CHUNK]
            self.buf = fits[0] if fits else _huge_pages(mmap.mmap(-1, CHUNK))
            self._free[:] = [b for b in self._free if b is not self.buf and len(b) == CHUNK]
        self.view = memoryview(self.buf)
        return self.view

    def __exit__(self, *_exc: object) -> None:
        self.view.release()
        with self._lock:
            self._free.append(self.buf)


def _huge_pages(region: mmap.mmap) -> mmap.mmap:
    # Measured here: direct writes of 2 GB from huge pages took 0.81 s against 1.0 s from 4 KiB
    # pages (fewer pages to pin per write).
    region.madvise(mmap.MADV_HUGEPAGE)
    return region


class ChecksumError(OSError):
    """Bytes read do not match their recorded CRC."""


def read_ranges(path: str, nbytes: int, chunks: Sequence[int], spans: Sequence[tuple[int, memoryview]]) -> int:
    """Fill each (file offset, destination) span from the file, checking the CRC of every chunk the
    spans touch (each chunk read once, whole); the bytes read. `chunks` are the file's chunk CRCs
    (a file of one chunk passes its whole-file CRC)."""
    needed = sorted({i for off, dst in spans if len(dst)
                     for i in range(off // CHUNK_BYTES, (off + len(dst) - 1) // CHUNK_BYTES + 1)})
    read = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(CHUNK_BYTES)
        for index in needed:
            start = index * CHUNK_BYTES
            length = min(CHUNK_BYTES, nbytes - start)
            view = memoryview(buf)[:length]
            got = os.preadv(fd, [view], start)
            if got != length:
                raise ShortFileError(errno.EIO, f"{path} ends at byte {start + got}, before the end of its data")
            if crc32(view) != chunks[index]:
                raise ChecksumError(errno.EIO, f"checksum mismatch in {os.path.basename(path)} at byte {start}")
            read += length
            for off, dst in spans:
                lo, hi = max(off, start), min(off + len(dst), start + length)
                if lo < hi:
                    dst[lo - off : hi - off] = view[lo - start : hi - start]
    finally:
        os.close(fd)
    return read
