"""The safetensors format: headers built and parsed (as untrusted input), and files as byte segments.

Files are standard safetensors (`safetensors.load_file` reads them). A file is written from each
tensor's own memory (no serialised copy: fresh allocations cost more than the disk on the machines
we measured) and read back straight into the caller's tensors, with the CRC32 of every byte on the
way, so a save and a resume each touch every byte once; `parallel_io` does the I/O.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from resilient_slurm.checkpoint.crc32 import crc32
from resilient_slurm.checkpoint.parallel_io import (
    FileDigest,
    InFile,
    OutFile,
    Part,
    chunk_parts,
    digest,
    read_files,
    write_files,
)

MAX_HEADER_BYTES = 100 << 20
_ALIGN = 8

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class FormatError(ValueError):
    """A safetensors file is malformed; the message says how."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    """Absolute byte offset of the tensor's data in the file."""
    end: int


@dataclass(frozen=True)
class Header:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int


def bytes_view(t: torch.Tensor) -> memoryview:
    """The tensor's own memory as bytes (no copy); it must be a contiguous CPU tensor."""
    array: Any = t.reshape(-1).view(torch.uint8).numpy()
    return memoryview(array).cast("B")


def build_header(tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


def write_file(path: str, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None,
               threads: int = 1) -> FileDigest:
    """Write tensors (contiguous, on CPU) to a new file and fsync it."""
    return write_files([out_file(path, tensors, metadata)], threads)[0]


def out_file(path: str, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> OutFile:
    """A safetensors file as byte segments: its header, then each tensor's own memory (no copy)."""
    return OutFile(path, [memoryview(build_header(tensors, metadata))] + [bytes_view(t) for _, t in tensors])


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def write_bytes(path: str, data: bytes) -> FileDigest:
    """Write a small file (JSON) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    parts: list[Part] = []
    chunk_parts(memoryview(data), 0, parts)
    return digest(len(data), parts)


def parse_header(prefix: bytes, file_size: int) -> Header:
    """Parse and bounds-check a header; `prefix` must hold at least the first 8 + N bytes."""
    if file_size < 8 or len(prefix) < 8:
        raise FormatError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES or 8 + n > file_size:
        raise FormatError(f"header length {n} does not fit a {file_size}-byte file")
    try:
        raw = json.loads(prefix[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"header is not JSON ({e.__class__.__name__})") from None
    if not isinstance(raw, dict):
        raise FormatError("header is not a JSON object")
    data_start = 8 + n
    metadata = raw.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("__metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, spec in raw.items():
        tensors[name] = _tensor_info(name, spec, data_start)
    spans = sorted((info.begin, info.end) for info in tensors.values())
    cursor = data_start
    for begin, end in spans:
        if begin != cursor:
            raise FormatError("tensor data overlaps or leaves a hole")
        cursor = end
    if cursor != file_size:
        raise FormatError(f"tensor data ends at byte {cursor} but the file has {file_size}")
    return Header(tensors, metadata, data_start)


def _tensor_info(name: str, spec: object, data_start: int) -> TensorInfo:
    if not isinstance(spec, dict):
        raise FormatError(f"entry {name!r} is not an object")
    dtype = DTYPES.get(spec.get("dtype"))  # type: ignore[arg-type]
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if dtype is None:
        raise FormatError(f"tensor {name!r} has unknown dtype {spec.get('dtype')!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise FormatError(f"tensor {name!r} has a bad shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise FormatError(f"tensor {name!r} has bad data_offsets")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not 0 <= begin <= end or end - begin != numel * itemsize:
        raise FormatError(f"tensor {name!r}: data_offsets do not match its shape and dtype")
    return TensorInfo(dtype, tuple(shape), data_start + begin, data_start + end)


def read_header(path: str) -> Header:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        first = f.read(8)
        if len(first) < 8:
            raise FormatError("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", first)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise FormatError(f"header length {n} does not fit a {size}-byte file")
        return parse_header(first + f.read(n), size)


def read_into(path: str, header: Header, target_for: Callable[[str, TensorInfo], torch.Tensor]) -> int:
    """Read every tensor of the file into `target_for(name, info)` (a contiguous CPU tensor of the
    right dtype and shape) and return the CRC32 of the whole file, for the caller to compare."""
    return read_files([in_file(path, header, target_for)], threads=1)[0]


def in_file(path: str, header: Header, target_for: Callable[[str, TensorInfo], torch.Tensor]) -> InFile:
    """The file as segments to read into: a scratch buffer for the header, then each target tensor."""
    segments = [memoryview(bytearray(header.data_start))]
    for name, info in sorted(header.tensors.items(), key=lambda item: item[1].begin):
        target = target_for(name, info)
        if (target.dtype != info.dtype or tuple(target.shape) != info.shape or not target.is_contiguous()
                or target.device.type != "cpu"):
            raise FormatError(f"tensor {name!r}: target is {target.dtype}{tuple(target.shape)}, "
                              f"file has {info.dtype}{info.shape}")
        segments.append(bytes_view(target))
    return InFile(path, segments)


def file_crc32(path: str) -> int:
    crc = 0
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            crc = crc32(view[:n], crc)
    return crc
