"""The data's version, cheap enough to take at every start of a run on any corpus size.

A file's fingerprint is a sha256 over its size, its modification time and sampled blocks of its
bytes (the first and last block, and blocks spread evenly between): about a megabyte read per file
whatever its size, where hashing every byte of a terabyte corpus on every rank at every start would
cost minutes. It catches a file replaced, grown, truncated or rewritten in place (the mtime); it can
miss an edit that keeps the size, restores the mtime and falls between the samples. One rank takes
it and hands it to the others (`runtime/build.py`), so a start reads the samples once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resilient_slurm.errors import InputError

BLOCK = 1 << 16
SAMPLES = 16
"""Blocks read between the first and the last."""


class DataChangedError(InputError):
    """The data a run was started on is not the data there now; one line naming the file."""


@dataclass(frozen=True)
class DataFingerprint:
    """What the run record stores as the data's version: a digest over every file, and each file's."""

    digest: str
    files: dict[str, str]
    """Absolute path → the file's fingerprint."""

    def to_record(self) -> dict[str, Any]:
        return {"digest": self.digest, "files": dict(self.files)}


def file_fingerprint(path: str) -> str:
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        for offset in _sample_offsets(st.st_size):
            h.update(os.pread(f.fileno(), BLOCK, offset))
    return h.hexdigest()


def fingerprint(files: list[str]) -> DataFingerprint:
    per_file = {path: file_fingerprint(path) for path in files}
    return DataFingerprint(digest(per_file), per_file)


def check_unchanged(recorded: Mapping[str, Any], current: DataFingerprint) -> None:
    """Raise DataChangedError, naming the first file that differs, unless `current` is the data of
    `recorded` (a `to_record()` saved when the run started)."""
    if recorded.get("digest") == current.digest:
        return
    before: Mapping[str, str] = recorded.get("files") or {}
    fix = "restore it, or start a new run on the new data (a new run.name)"
    for path in sorted(set(before) | set(current.files)):
        if path not in current.files:
            raise DataChangedError(f"data file {path} is gone since this run started; {fix}")
        if path not in before:
            raise DataChangedError(f"data file {path} appeared since this run started; {fix}")
        if before[path] != current.files[path]:
            raise DataChangedError(f"data file {path} changed since this run started (fingerprint "
                                   f"{before[path][:12]} -> {current.files[path][:12]}); {fix}")
    raise DataChangedError(f"data files {', '.join(sorted(current.files))[:200]} changed since this run started; {fix}")


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _sample_offsets(size: int) -> list[int]:
    if size <= (SAMPLES + 2) * BLOCK:
        return list(range(0, size, BLOCK))  # a small file is read whole
    last = size - BLOCK
    return [0, *(round(last * (i + 1) / (SAMPLES + 1)) for i in range(SAMPLES)), last]
