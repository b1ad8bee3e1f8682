"""Two things every writer of a run's small files needs: an atomic replace that survives a crash,
and the one spelling of a UTC time the ledger, run.json and every other record use.

Standard library only: `tools/xid_scan` and the Slurm side import it from bare environments.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` so that a reader, or the file after a crash, is either the old
    content or the new, never a mix: written to a hidden temporary beside it, fsynced, renamed over
    it, and the directory fsynced so the rename itself is durable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def utc_stamp(epoch_s: float | None = None) -> str:
    """`2026-12-01T21:11:18.123Z`: UTC, milliseconds, `Z` (now, or at `epoch_s`)."""
    moment = datetime.now(timezone.utc) if epoch_s is None else datetime.fromtimestamp(epoch_s, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamp_seconds(stamp: str) -> float:
    """Seconds since the epoch of a stamp `utc_stamp` wrote (or any ISO-8601 time with a zone or `Z`)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
