"""Checkpoint files sent between ranks over the network: gloo point-to-point messages on the
checkpoint's own process group, each file checked against the manifest's CRC before it takes its
name. A node-local hot tier uses it to copy each node's files to its buddy after a save, and at a
resume to bring each node the files it needs from whichever rank holds them (`nodes.py`).

Every rank runs the same rounds of the same plan: it posts its own sends and receives of a round
(message tags are their places in the round, so no two can be confused), waits for them, then
writes what it received. A file arrives in order, one message after another, into `<name>.part`;
when its last byte is in, its CRC is compared with the manifest's and only then is it renamed into
place. So a file under its own name is whole and checked, whoever wrote it; a mismatch, or a source
that could not be read, is reported, never kept. A rank that cannot read a file it must send sends
zeros instead, so that the others are not left waiting for a message that never comes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from resilient_slurm.checkpoint.crc32 import crc32
from resilient_slurm.checkpoint.nodes import Transfer
from resilient_slurm.checkpoint.safetensors_io import bytes_view

PART_SUFFIX = ".part"


@dataclass
class _Incoming:
    path: str
    fd: int
    crc: int = 0
    received: int = 0


def exchange(plan_rounds: Sequence[Sequence[Transfer]], rank: int, group: Any, source: Callable[[Transfer], str],
             dest: Callable[[Transfer], str], crcs: Mapping[str, int]) -> list[str]:
    """Run this rank's part of every round; the problems it met (empty when every file it
    received checked out and every file it had to send could be read)."""
    problems: list[str] = []
    incoming: dict[tuple[int, str], _Incoming] = {}
    try:
        for transfers in plan_rounds:
            works = []
            sending: list[torch.Tensor] = []  # alive until their sends are done
            received: list[tuple[Transfer, torch.Tensor]] = []
            for tag, t in enumerate(transfers):
                if t.src == rank and t.length:
                    sending.append(_read(source(t), t, problems))
                    works.append(dist.isend(sending[-1], t.dst, group=group, tag=tag))
                if t.dst == rank:
                    buf = torch.empty(t.length, dtype=torch.uint8)
                    if t.length:
                        works.append(dist.irecv(buf, t.src, group=group, tag=tag))
                    received.append((t, buf))
            for work in works:
                if work is not None:
                    work.wait()
            for t, buf in received:
                problem = _write(incoming, t, buf, dest(t), crcs[t.rel])
                if problem:
                    problems.append(problem)
    finally:
        for f in incoming.values():
            os.close(f.fd)
            _unlink(f.path)
    return problems


def _read(path: str, t: Transfer, problems: list[str]) -> torch.Tensor:
    buf = bytearray(t.length)
    try:
        with open(path, "rb") as f:
            got = f.readinto(memoryview(buf)) if f.seek(t.offset) == t.offset else 0
        if got != t.length:
            problems.append(f"{path}: {got} of {t.length} bytes at offset {t.offset}")
    except OSError as e:
        problems.append(f"{path}: {e.__class__.__name__}: {e}")
    return torch.frombuffer(buf, dtype=torch.uint8) if t.length else torch.empty(0, dtype=torch.uint8)


def _write(incoming: dict[tuple[int, str], _Incoming], t: Transfer, buf: torch.Tensor, path: str,
           crc: int) -> str | None:
    """Append one message to its file; at the last byte, check the CRC and rename into place."""
    key = (t.src, path)
    if t.offset == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        part = path + PART_SUFFIX
        incoming[key] = _Incoming(part, os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    f = incoming[key]
    data = bytes_view(buf)
    view = data
    while view:
        view = view[os.pwrite(f.fd, view, t.offset + len(data) - len(view)):]
    f.crc = crc32(data, f.crc)
    f.received += t.length
    if t.offset + t.length < t.size:
        return None
    del incoming[key]
    try:
        os.fsync(f.fd)
    finally:
        os.close(f.fd)
    if f.received != t.size or f.crc != crc:
        _unlink(f.path)
        return f"{t.rel} from rank {t.src}: CRC {f.crc:08x} over {f.received} bytes, the manifest says {crc:08x}"
    os.replace(f.path, path)
    return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
