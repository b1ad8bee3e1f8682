"""Each source's own order: its windows, the held-out ones, and a fresh permutation of the rest for
every epoch, kept as memory-mapped index files so that a start maps them instead of computing them.

A source of T tokens has N = (T - 1) // seq_len windows: window w is tokens [w*L, w*L + L + 1)
(consecutive windows share one token, as Megatron's samples do). `val_sequences` of them, drawn with
a generator seeded by the source's fingerprint alone (the same held-out set for every seed), are
never trained on; epoch e trains the others in the order `default_rng([seed, e, source]).permutation`.
All of it is a pure function of (source fingerprint, seq_len, seed, val_sequences, epoch); the files
only save recomputing it, and `python -m resilient_slurm.data prepare` writes them ahead of a run.

An entry is a directory `<root>/<source>-<key>/` keyed by those inputs: `val.npy` and `meta.json`
(window counts, the largest token id, what the build cost), then `epoch-NNNNN.npy` as epochs are
needed. Each file is written under a temporary name and renamed; `meta.json` is the entry's marker,
renamed last. Whoever needs a missing file first builds it, under an exclusive lock on the entry, so
ranks starting together build it once and the others wait and map it (the chat cache's pattern: no
collective, so a long build cannot time out a barrier); without flock (some Lustre mounts) they
build the same bytes side by side and the renames keep every file whole.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.sources import ORDER_DIR, Source
from resilient_slurm.files import atomic_write, utc_stamp

FORMAT = 1
"""Bump when the order's definition or the files' layout changes: old entries are then ignored."""
META = "meta.json"


def index_root(source: Source, index_dir: str) -> str:
    """data.index_dir, else order-index/ beside the source's first file."""
    return index_dir or os.path.join(os.path.dirname(os.path.abspath(source.files[0].path)), ORDER_DIR)


def order_key(source: Source, seq_len: int, seed: int, val_sequences: int) -> str:
    parts = {"format": FORMAT, "source": source.digest, "seq_len": seq_len, "seed": seed, "val": val_sequences,
             "generator": "PCG64"}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class BuildReport:
    """What opening an entry cost: the files it had to build and the seconds spent."""

    built: list[str] = field(default_factory=list)
    seconds: float = 0.0


class SourceOrder:
    """One source's windows in training order, epoch by epoch, and its held-out windows."""

    def __init__(self, source: Source, seq_len: int, seed: int, val_sequences: int, index_dir: str) -> None:
        self.source, self.seq_len, self.seed = source, seq_len, seed
        self.windows = (source.num_tokens - 1) // seq_len
        if val_sequences >= self.windows:
            raise TokenDataError(f"data.sources[{source.name}]: {source.num_tokens} tokens make {self.windows} windows "
                                 f"of seq_len+1={seq_len + 1}, and data.val_sequences={val_sequences} would hold out "
                                 "all of them; lower data.val_sequences or data.seq_len, or add data")
        self.val_sequences = val_sequences
        self.train_windows = self.windows - val_sequences
        self.entry = os.path.join(index_root(source, index_dir), f"{source.name}-{order_key(source, seq_len, seed, val_sequences)}")
        self.report = BuildReport()
        self._epochs: dict[int, np.ndarray] = {}
        self._meta = self._read_meta() or self._build_meta()
        self.max_tokens = [int(m) for m in self._meta["max_tokens"]]
        """The largest token id of each file (scanned once, when the entry was built)."""
        self.val = np.load(os.path.join(self.entry, "val.npy"), mmap_mode="r")

    def epoch(self, e: int) -> np.ndarray:
        """The window ids epoch `e` trains, in order (mapped; built first when missing)."""
        if e not in self._epochs:
            path = os.path.join(self.entry, f"epoch-{e:05d}.npy")
            if not os.path.exists(path):
                with self._building():
                    if not os.path.exists(path):
                        start = time.perf_counter()
                        _write_npy(path, self._permutation(e))
                        self._count(path, start)
            self._epochs[e] = np.load(path, mmap_mode="r")
        return self._epochs[e]

    @property
    def epochs_mapped(self) -> int:
        return len(self._epochs)

    def ready(self, epochs: int) -> None:
        """Have epochs 0..epochs-1 on disk (what the run's budget reaches)."""
        for e in range(epochs):
            self.epoch(e)

    def _permutation(self, e: int) -> np.ndarray:
        train = np.ones(self.windows, bool)
        train[np.asarray(self.val)] = False
        ids = np.flatnonzero(train)
        rng = np.random.default_rng([self.seed, e, int(self.source.digest[:16], 16)])
        return ids[rng.permutation(len(ids))].astype(_id_dtype(self.windows))

    def _read_meta(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.entry, META), encoding="utf-8") as f:
                meta: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            return None
        return meta if meta.get("format") == FORMAT else None

    def _build_meta(self) -> dict[str, Any]:
        with self._building():
            meta = self._read_meta()
            if meta is not None:
                return meta
            start = time.perf_counter()
            max_tokens = [f.scan() for f in self.source.files]
            rng = np.random.default_rng([int(self.source.digest[:16], 16), 0x7A1])
            val: np.ndarray = np.sort(rng.choice(self.windows, self.val_sequences, replace=False)).astype(_id_dtype(self.windows))
            _write_npy(os.path.join(self.entry, "val.npy"), val)
            meta = {"format": FORMAT, "source": self.source.name, "digest": self.source.digest,
                    "seq_len": self.seq_len, "seed": self.seed, "tokens": self.source.num_tokens,
                    "windows": self.windows, "val_sequences": self.val_sequences, "max_tokens": max_tokens,
                    "files": len(self.source.files), "built_at": utc_stamp(),
                    "scan_seconds": round(time.perf_counter() - start, 3)}
            path = os.path.join(self.entry, META)
            atomic_write(Path(path), json.dumps(meta, indent=1, sort_keys=True) + "\n")
            self._count(path, start)
            return meta

    def _count(self, path: str, start: float) -> None:
        self.report.built.append(os.path.basename(path))
        self.report.seconds += time.perf_counter() - start

    @contextmanager
    def _building(self) -> Iterator[None]:
        try:
            os.makedirs(self.entry, exist_ok=True)
            lock = open(self.entry + ".lock", "a")
        except OSError as e:
            raise TokenDataError(f"data.sources[{self.source.name}]: cannot write its order index in {self.entry} "
                                 f"({e.strerror}); set data.index_dir to a writable directory every rank sees, or "
                                 "run python -m resilient_slurm.data prepare where it is writable") from None
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError:
                pass  # no flock here: concurrent builders write the same bytes and each rename is atomic
            yield


def epochs_for(counter: int, train_windows: int) -> int:
    """Epochs of a source that its first `counter` sequences reach."""
    return -(-counter // train_windows) if counter > 0 else 0


def _id_dtype(windows: int) -> type:
    return np.uint32 if windows < 2**32 else np.int64


def _write_npy(path: str, array: np.ndarray) -> None:
    # Streamed to a temporary and renamed (files.atomic_write would hold a second copy in memory,
    # and an epoch of a large source is gigabytes).
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

