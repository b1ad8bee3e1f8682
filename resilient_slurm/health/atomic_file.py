"""Small state files that concurrent writers update safely: atomic replace and an advisory lock.

Readers never lock: a file is only ever replaced whole by rename, so it always holds the old or
the new content. Writers that read-modify-write hold `locked()` on a separate lock file, because
the data file's inode changes with every replace. `flock` works across nodes on NFSv4 (Linux
emulates it with POSIX locks); Lustre needs the `flock` mount option.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data`: write a temporary file beside it, fsync it, rename it over
    `path`, fsync the directory. A crash leaves either the old file or the new one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def locked(lock_path: str, timeout_s: float = 30.0) -> Iterator[None]:
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
