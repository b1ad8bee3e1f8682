"""The tokenized-data cache: the data files, the cache key, and a build that is safe when
every rank starts at once.

A cache entry is a directory `<cache_root>/<key>/` of `.npy` arrays plus `header.json`, written
last. The key hashes everything that changes its bytes: the data files' fingerprints, the tokenizer
(`ChatTokenizer.digest`), the settings that shape the rows, and `FORMAT`. A hit only maps the
arrays (numpy memmaps), so a resume never tokenizes again.

Building: every process that misses takes an exclusive `flock` on `<key>.lock`, looks again, and
only then builds, into a private temporary directory that it renames to `<key>` when complete. The
lock keeps the other ranks from repeating the work (they wait and then hit); the rename is what
makes it correct. Where the filesystem offers no flock (Lustre mounted without `-o flock`), ranks
build the same bytes side by side and the first rename wins; the others discard their copy.
A builder killed mid-way leaves only its temporary directory behind, never a partial entry.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from resilient_slurm.data.fingerprint import digest
from resilient_slurm.errors import InputError

FORMAT = 1
"""Version of the cache's layout and of the pipeline that writes it; bump it when either changes."""
HEADER = "header.json"


def data_files(path: str) -> list[str]:
    """The `.jsonl` files of data.path: the file itself, or those under the directory, sorted."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    if not os.path.isdir(path):
        raise InputError(f"data.path: {path} does not exist; point it at a .jsonl file or a directory of them")
    found = sorted(os.path.abspath(os.path.join(d, f)) for d, _, names in os.walk(path)
                   for f in names if f.endswith(".jsonl"))
    if not found:
        raise InputError(f"data.path: {path} holds no .jsonl files; point it at a file or add some")
    return found


def cache_key(parts: Mapping[str, Any]) -> str:
    return digest({"format": FORMAT, **parts})[:24]


def open_or_build(root: str, key: str, build: Callable[[str], None]) -> tuple[str, bool]:
    """The entry's directory, and whether it was there already; `build(tmp_dir)` writes a missing
    one (all its arrays, then the header)."""
    final = os.path.join(root, key)
    if _complete(final):
        return final, True
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise OSError(f"data.cache_dir: cannot create {root} ({e.strerror}); set data.cache_dir to a writable "
                      "directory that every rank sees") from None
    with _exclusive(os.path.join(root, f"{key}.lock")):
        if _complete(final):
            return final, True
        tmp = os.path.join(root, f".{key}.tmp-{socket.gethostname()}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # a dead builder's, with our host and pid
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not _complete(final):
                raise
    return final, False


def read_header(entry: str) -> dict[str, Any]:
    with open(os.path.join(entry, HEADER), encoding="utf-8") as f:
        header: dict[str, Any] = json.load(f)
    return header


def write_header(entry: str, header: Mapping[str, Any]) -> None:
    with open(os.path.join(entry, HEADER), "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, **header}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _complete(entry: str) -> bool:
    try:
        return read_header(entry).get("format") == FORMAT
    except (OSError, ValueError):
        return False


@contextmanager
def _exclusive(path: str) -> Iterator[None]:
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            pass  # no flock on this filesystem: the atomic rename alone keeps the entry whole
        yield
