import errno
import mmap
import os
import zlib

import pytest
import torch

from resilient_slurm.checkpoint import parallel_io
from resilient_slurm.checkpoint.parallel_io import (
    InFile,
    OutFile,
    ShortFileError,
    read_files,
    write_files,
)


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    # Several ranges per file and several chunks per range, without writing megabytes.
    monkeypatch.setattr(parallel_io, "TASK", 3 * parallel_io.BLOCK)
    monkeypatch.setattr(parallel_io, "CHUNK", parallel_io.BLOCK)


def segments(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [memoryview(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy()) for n in sizes]


@pytest.mark.parametrize("sizes", [[1], [5, 4096, 1], [4096 * 3], [4096 * 3 + 1, 17, 8191], [0, 3, 0, 12289]])
@pytest.mark.parametrize("threads", [1, 3])
def test_written_files_hold_every_segment_in_order_with_the_right_crc(tmp_path, sizes, threads):
    files = [OutFile(str(tmp_path / f"f{i}"), segments(sizes, seed=i)) for i in range(3)]
    digests = write_files(files, threads)
    for f, d in zip(files, digests):
        data = b"".join(bytes(s) for s in f.segments)
        assert open(f.path, "rb").read() == data
        assert (d.nbytes, d.crc32) == (len(data), zlib.crc32(data))


@pytest.mark.parametrize("sizes", [[1], [5, 4096, 1], [4096 * 3 + 1, 17, 8191], [0, 3, 0, 12289]])
def test_buffered_writes_go_straight_from_the_segments_with_every_chunk_crc(tmp_path, monkeypatch, sizes):
    monkeypatch.setattr(parallel_io, "_bounce", None)  # no bounce copy: it would fail here
    monkeypatch.setattr(parallel_io, "CHUNK_BYTES", 5000)  # chunks that do not line up with the ranges
    files = [OutFile(str(tmp_path / f"f{i}"), segments(sizes, seed=i)) for i in range(2)]
    for f, d in zip(files, write_files(files, threads=2, direct=False)):
        data = b"".join(bytes(s) for s in f.segments)
        assert open(f.path, "rb").read() == data and (d.nbytes, d.crc32) == (len(data), zlib.crc32(data))
        chunks = [zlib.crc32(data[i : i + 5000]) for i in range(0, len(data), 5000)]
        assert d.chunks == (tuple(chunks) if len(chunks) > 1 else ())


@pytest.mark.parametrize("nbytes", [1, 4095, 4096, 3 * 4096, 3 * 4096 + 5, 10 * 4096 + 123])
def test_an_aligned_image_is_written_straight_from_memory(tmp_path, nbytes):
    view = memoryview(mmap.mmap(-1, parallel_io.round_up(nbytes)))  # page-aligned, as staging buffers are
    view[:] = os.urandom(len(view))
    path = str(tmp_path / "img")
    (digest,) = write_files([OutFile(path, [view[:nbytes]], aligned=view)], threads=2)
    assert open(path, "rb").read() == bytes(view[:nbytes])  # padding written for O_DIRECT is cut off
    assert digest.crc32 == zlib.crc32(view[:nbytes])


@pytest.mark.parametrize("sizes", [[7], [5, 4096, 1], [4096 * 3 + 1, 17, 8191]])
def test_reads_fill_the_targets_and_return_the_file_crc(tmp_path, sizes):
    data = b"".join(bytes(s) for s in segments(sizes))
    path = tmp_path / "f"
    path.write_bytes(data)
    targets = [memoryview(bytearray(n)) for n in sizes]
    (crc,) = read_files([InFile(str(path), targets)], threads=3)
    assert b"".join(bytes(t) for t in targets) == data and crc == zlib.crc32(data)


def test_reading_a_file_shorter_than_its_segments_fails(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ShortFileError, match="ends at byte 100"):
        read_files([InFile(str(path), [memoryview(bytearray(5000))])], threads=1)


def test_many_small_segments_are_read_in_batches_of_iov_max(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel_io, "_IOV_MAX", 4)
    data = os.urandom(50)
    path = tmp_path / "f"
    path.write_bytes(data)
    targets = [memoryview(bytearray(1)) for _ in range(50)]
    (crc,) = read_files([InFile(str(path), targets)], threads=1)
    assert b"".join(bytes(t) for t in targets) == data and crc == zlib.crc32(data)


def test_a_write_error_propagates_and_closes_every_file(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    opened_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="No space left"):
        write_files([OutFile(str(tmp_path / "f"), segments([10]))], threads=2)
    assert len(os.listdir("/proc/self/fd")) == opened_before
