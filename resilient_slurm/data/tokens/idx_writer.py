"""Writing a Megatron indexed dataset (`.bin` + `.idx`), one document per sequence, as Megatron's
`IndexedDatasetBuilder` writes it without `--split-sentences`.

Tokens stream to the `.bin` as documents arrive; the lengths are kept (4 bytes a document) and the
`.idx` is written at `finish`, fsynced. The caller writes to temporary names and renames them when
both are finished: this class never decides what counts as complete.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from resilient_slurm.data.tokens.idx_format import ITEMSIZE, encode_header

_CHUNK = 1 << 22


class IdxWriter:
    def __init__(self, bin_path: str, idx_path: str, dtype: str) -> None:
        self.bin_path, self.idx_path, self.dtype = bin_path, idx_path, dtype
        self._bin = open(bin_path, "wb")
        self._lengths: list[np.ndarray] = []
        self.documents = 0
        self.tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents whose tokens lie back to back in `tokens`, `lengths[i]` tokens each."""
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._add_lengths(lengths)

    def add_file(self, bin_path: str, lengths: np.ndarray) -> None:
        """Documents already in this dtype in another `.bin` (a shard being merged): copied as bytes."""
        with open(bin_path, "rb") as src:
            shutil.copyfileobj(src, self._bin, 1 << 24)
        self._add_lengths(lengths)

    def _add_lengths(self, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, dtype=np.int32)
        self._lengths.append(lengths)
        self.documents += len(lengths)
        self.tokens += int(lengths.sum(dtype=np.int64))

    def finish(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        count = self.documents
        with open(self.idx_path, "wb") as f:
            f.write(encode_header(self.dtype, count, count + 1))
            for part in self._lengths:
                f.write(part.tobytes())
            offset = 0
            for part in self._lengths:
                ends = offset + np.cumsum(part, dtype=np.int64) * ITEMSIZE[self.dtype]
                f.write(np.concatenate(([offset], ends[:-1])).astype(np.int64).tobytes() if len(part) else b"")
                offset = int(ends[-1]) if len(part) else offset
            for lo in range(0, count + 1, _CHUNK):
                f.write(np.arange(lo, min(lo + _CHUNK, count + 1), dtype=np.int64).tobytes())
            f.flush()
            os.fsync(f.fileno())

    def abort(self) -> None:
        self._bin.close()
