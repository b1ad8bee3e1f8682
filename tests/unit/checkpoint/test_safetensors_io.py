import os
import struct

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.checkpoint.safetensors_io import (
    FormatError,
    build_header,
    file_crc32,
    parse_header,
    read_header,
    read_into,
    write_file,
)


def tensors():
    g = torch.Generator().manual_seed(3)
    return [("w", torch.randn(33, 7, generator=g)), ("b16", torch.randn(5, generator=g).bfloat16()),
            ("step", torch.tensor(12.0)), ("ids", torch.arange(10)), ("empty", torch.zeros(0, 4)),
            ("mask", torch.tensor([True, False]))]


def test_written_files_are_standard_safetensors(tmp_path):
    path = tmp_path / "x.safetensors"
    digest = write_file(str(path), tensors(), metadata={"format": "pt"})
    assert digest.nbytes == path.stat().st_size
    assert digest.crc32 == file_crc32(str(path))
    loaded = load_file(str(path))
    for name, t in tensors():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)


def test_read_into_preallocated_targets_is_exact_and_returns_the_file_crc(tmp_path):
    path = str(tmp_path / "x.safetensors")
    digest = write_file(path, tensors())
    header = read_header(path)
    targets = {n: torch.empty_like(t) for n, t in tensors()}
    assert read_into(path, header, lambda n, _info: targets[n]) == digest.crc32
    for name, t in tensors():
        assert torch.equal(targets[name], t)


def test_read_into_rejects_a_mismatched_target(tmp_path):
    path = str(tmp_path / "x.safetensors")
    write_file(path, [("w", torch.zeros(4, 4))])
    with pytest.raises(FormatError, match="target is"):
        read_into(path, read_header(path), lambda n, _i: torch.zeros(4, 5))


def test_write_refuses_to_overwrite(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write_file(str(path), tensors())
    assert path.read_bytes() == b"old"


def _file(header_json: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header_json)) + header_json + data


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "shorter than"),
        (b"\x01\x02", "shorter than"),
        (struct.pack("<Q", 1 << 40), "does not fit"),
        (struct.pack("<Q", 50) + b"{}", "does not fit"),
        (_file(b"not json"), "not JSON"),
        (_file(b"\xff\xfe"), "not JSON"),
        (_file(b"[1, 2]"), "not a JSON object"),
        (_file(b'{"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4), "unknown dtype"),
        (_file(b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', b"\0" * 4), "bad shape"),
        (_file(b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 4), "do not match"),
        (_file(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}', b"\0" * 4), "bad data_offsets"),
        (_file(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 8), "file has"),
        (_file(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8), "hole"),
        (_file(b'{"__metadata__": {"a": 1}}'), "__metadata__"),
    ],
)
def test_malformed_headers_are_rejected_with_a_reason(raw, reason):
    with pytest.raises(FormatError, match=reason):
        parse_header(raw, len(raw))


def test_header_is_padded_to_eight_bytes():
    head = build_header(tensors())
    assert len(head) % 8 == 0


def test_falls_back_to_buffered_writes_when_the_filesystem_refuses_direct_io(tmp_path, monkeypatch):
    import errno
    import fcntl
    import os

    real_pwrite = os.pwrite
    refused = []

    def picky_pwrite(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", picky_pwrite)
    path = str(tmp_path / "x.safetensors")
    digest = write_file(path, tensors())
    assert refused, "the test did not exercise the fallback"
    assert digest.crc32 == file_crc32(path)
    assert all(torch.equal(load_file(path)[n], t) for n, t in tensors())


def test_sizes_around_the_staging_buffer_and_block_boundaries(tmp_path):
    from resilient_slurm.checkpoint import parallel_io

    for numel in (0, 1, 1023, 1024, parallel_io.CHUNK // 4 - 3, parallel_io.CHUNK // 4 + 5):
        path = str(tmp_path / f"x{numel}.safetensors")
        t = torch.arange(numel, dtype=torch.float32)
        digest = write_file(path, [("t", t)])
        assert digest.nbytes == os.path.getsize(path)
        assert torch.equal(load_file(path)["t"], t)
