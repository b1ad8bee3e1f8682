"""Read back what wandb wrote locally: the `.wandb` transaction log of each segment of a run.

wandb keeps no Python reader for these files any more (the sync is done by its Go core), so this
module decodes them: a 7-byte file header (`:W&B`, magic 0xBEE1, version 0), then LevelDB's log
framing (https://github.com/google/leveldb/blob/main/doc/log_format.md): 32 KiB blocks of records,
each `crc32 (LE u32) | length (LE u16) | type (u8) | data`, where a payload longer than a block is
split into FIRST, MIDDLE... LAST pieces and a block's last < 7 bytes are zero padding. wandb's CRC
is zlib's CRC-32 seeded with the type byte (not LevelDB's CRC-32C). Each payload is one
`wandb_internal_pb2.Record`.

A segment whose process was SIGKILLed ends in a torn record: reading stops there, as wandb's own
sync does, so the result is exactly what `wandb sync` would upload.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_slurm.errors import InputError

FILE_HEADER = struct.Struct("<4sHB")
FILE_IDENT, FILE_MAGIC, FILE_VERSION = b":W&B", 0xBEE1, 0
RECORD_HEADER = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}
# offline-run-20261129_112454-<id> (offline) or run-... (online), one per process; a second
# process starting within the same second gets `-1`, `-2`... appended.
_SEGMENT = r"^(?:offline-)?run-(\d{{8}}_\d{{6}})-{run_id}(?:-(\d+))?$"


class WandbFileError(InputError):
    """Not a wandb transaction log (bad header); the message names the file."""


@dataclass(frozen=True)
class HistoryRow:
    step: int
    values: dict[str, Any]


def payloads(path: Path) -> Iterator[bytes]:
    """Every complete record payload of one `.wandb` file, in order; stops at a torn tail."""
    data = path.read_bytes()
    if len(data) < FILE_HEADER.size:
        raise WandbFileError(f"{path}: shorter than a wandb file header")
    ident, magic, version = FILE_HEADER.unpack_from(data)
    if (ident, magic, version) != (FILE_IDENT, FILE_MAGIC, FILE_VERSION):
        raise WandbFileError(f"{path}: not a wandb transaction log (header {ident!r} {magic:#x} v{version})")
    pos = FILE_HEADER.size
    pieces: list[bytes] = []
    while True:
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER.size:
            pos += left_in_block
        if pos + RECORD_HEADER.size > len(data):
            return
        crc, length, kind = RECORD_HEADER.unpack_from(data, pos)
        body = data[pos + RECORD_HEADER.size : pos + RECORD_HEADER.size + length]
        if kind not in _TYPE_CRC or len(body) < length or zlib.crc32(body, _TYPE_CRC[kind]) != crc:
            return
        pos += RECORD_HEADER.size + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pieces = [body]
        elif pieces:
            pieces.append(body)
            if kind == LAST:
                yield b"".join(pieces)
                pieces = []


def history(path: Path) -> list[HistoryRow]:
    """The history rows of one segment, in the order they were logged."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for payload in payloads(path):
        record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf class
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            h = record.history
            rows.append(HistoryRow(h.step.num, {_key(i): _value(i) for i in h.item}))
    return rows


def segments(wandb_dir: Path, run_id: str) -> list[Path]:
    """The `.wandb` files of run `run_id` under `wandb_dir`, oldest segment first."""
    pattern = re.compile(_SEGMENT.format(run_id=re.escape(run_id)))
    found = []
    for d in wandb_dir.iterdir() if wandb_dir.is_dir() else []:
        m = pattern.match(d.name)
        if m and (d / f"run-{run_id}.wandb").is_file():
            found.append((m.group(1), int(m.group(2) or 0), d / f"run-{run_id}.wandb"))
    return [path for _, _, path in sorted(found)]


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _value(item: Any) -> Any:
    kind = item.WhichOneof("value")
    if kind is None:
        return json.loads(item.value_json) if item.value_json else None
    if kind == "none":
        return None
    if kind == "json":
        return json.loads(item.json)
    return getattr(item, kind)
