"""What every writer of small shared files needs: an atomic replace that survives a crash, an
advisory lock for read-modify-write, and the one spelling of a UTC time the ledger, run.json and
every other record use.

Readers never lock: a file is only ever replaced whole by rename, so it always holds the old or the
new content. Writers that read-modify-write hold `locked()` on a separate lock file, because the
data file's inode changes with every replace. `flock` works across nodes on NFSv4 (Linux emulates it
with POSIX locks); Lustre needs the `flock` mount option.

Standard library only: `tools/xid_scan` and the Slurm side import it from bare environments.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` so that a reader, or the file after a crash, is either the old
    content or the new, never a mix: written to a hidden temporary of its own beside it (another
    writer's, even in this process, is another file), fsynced, renamed over it, and the directory
    fsynced so the rename itself is durable."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def locked(lock_path: str | Path, timeout_s: float = 30.0) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if missing). Raises TimeoutError when
    another holder keeps it longer than `timeout_s`: a stuck writer must not hang its callers."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"lock {lock_path} still held after {timeout_s:g} s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def utc_stamp(epoch_s: float | None = None) -> str:
    """`2026-12-01T21:11:18.123Z`: UTC, milliseconds, `Z` (now, or at `epoch_s`)."""
    moment = datetime.now(timezone.utc) if epoch_s is None else datetime.fromtimestamp(epoch_s, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamp_seconds(stamp: str) -> float:
    """Seconds since the epoch of a stamp `utc_stamp` wrote (or any ISO-8601 time with a zone or `Z`)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
