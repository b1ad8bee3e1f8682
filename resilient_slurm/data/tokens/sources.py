"""A mixture's sources: each one's files found from its path, read as one stream of tokens, and
fingerprinted by what it holds.

A source's path is a Megatron prefix (`/data/tok/web` for web.bin + web.idx), a single array file,
a glob (`/data/tok/web_*`, `/data/dolma/*.npy`), or a directory (every prefix and `.npy` under it).
Its files, sorted by path, are read as one stream: a window may run from the end of one file into
the next, and every file starts a new document.

The fingerprint is each file's name, size and header counts, in order (OLMo-core's choice: contents
are not hashed, so a start stays fast on any corpus size). Moving the files elsewhere keeps it;
replacing, adding, removing or resizing one changes it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from resilient_slurm.config import SourceConfig
from resilient_slurm.data.tokens.corpus import TokenFile, open_token_file
from resilient_slurm.data.tokens.errors import TokenDataError

TOKEN_SUFFIXES = (".idx", ".bin", ".npy")
ORDER_DIR = "order-index"
"""Where prepared orders live beside a source's files; skipped when a directory is searched."""


def find_files(key: str, path: str) -> list[str]:
    """The prefixes and array files a source path names, sorted."""
    if any(ch in path for ch in "*?["):
        found = sorted(glob.glob(path))
    elif os.path.isdir(path):
        found = []
        for parent, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if d != ORDER_DIR]
            found += [os.path.join(parent, name) for name in names]
        found.sort()
    else:
        if not (os.path.exists(path) or os.path.exists(path + ".idx") or os.path.exists(path + ".bin")):
            raise TokenDataError(f"{key}: {path} does not exist (no file, no {path}.bin/.idx); point it at a Megatron "
                                 "prefix, a token array, a glob or a directory of them")
        return [path]
    out: list[str] = []
    for f in found:
        stem, suffix = os.path.splitext(f)
        item = stem if suffix in (".idx", ".bin") else f if suffix == ".npy" else None
        if item is not None and item not in out:
            out.append(item)
    if not out:
        raise TokenDataError(f"{key}: {path} holds no token files (.bin/.idx prefixes, .npy arrays); point it at "
                             "tokenized data (python -m resilient_slurm.data tokenize)")
    return out


class Source:
    """One source of the mixture: its files as a single stream of tokens."""

    def __init__(self, name: str, weight: float, files: list[TokenFile]) -> None:
        self.name, self.weight, self.files = name, weight, files
        self.starts = np.concatenate(([0], np.cumsum([f.num_tokens for f in files], dtype=np.int64)))
        """Token offset of each file in the stream, then the stream's length."""
        self.num_tokens = int(self.starts[-1])
        self.identity = [f.identity() for f in files]
        self.digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()

    def read(self, start: int, stop: int, starts: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [start, stop) of the stream (int64), and where documents begin (a bool mask; a
        document that begins at the first token is not marked; all False unless `starts`)."""
        tokens = np.empty(stop - start, np.int64)
        begins = np.zeros(stop - start, bool)
        f = int(np.searchsorted(self.starts, start, "right")) - 1
        pos = start
        while pos < stop:
            while self.starts[f + 1] <= pos:
                f += 1
            base = int(self.starts[f])
            end = min(stop, int(self.starts[f + 1]))
            part = self.files[f].read(pos - base, end - base)
            tokens[pos - start:end - start] = part
            if starts:
                begins[pos - start + self.files[f].doc_starts(pos - base, part)] = True
                begins[pos - start] |= pos == base
            pos = end
        begins[0] = False
        return tokens, begins

    def where(self, token: int) -> dict[str, Any]:
        """The file a stream position lies in and the position within it: "the current data shard"."""
        f = min(int(np.searchsorted(self.starts, token, "right")) - 1, len(self.files) - 1)
        return {"file": self.files[f].path, "token": int(token - self.starts[f])}


def open_source(cfg: SourceConfig, eos_id: int | None, resolve: Callable[[str], str] = lambda p: p) -> Source:
    key = f"data.sources[{cfg.name}]"
    path = resolve(cfg.path)
    files = [open_token_file(p, cfg.dtype, eos_id) for p in find_files(f"{key}.path", path)]
    if sum(f.num_tokens for f in files) == 0:
        raise TokenDataError(f"{key}: {path} holds no tokens; point it at tokenized data")
    return Source(cfg.name, cfg.weight, [f for f in files if f.num_tokens])
