"""Raw text inputs of `tokenize`, read in order: `.jsonl`, `.jsonl.gz`, `.jsonl.zst`, parquet.

Each input yields its items with their line (or row) numbers: the raw bytes of a `.jsonl` line,
parsed later in a worker (records.py), or a parquet cell of the text column. `bytes_read()` is how
far into the file (its compressed bytes) the reader is, for the progress bar's ETA. zstandard and
pyarrow are imported only for their formats; pyarrow is the `parquet` extra.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from typing import IO, Any

from resilient_slurm.errors import InputError

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
PARQUET_EXTRA = "pip install 'resilient-slurm[parquet]'"


class TextInputError(InputError):
    """An input file cannot be read; one line naming it (tokenize exits 2)."""


def check_input(path: str) -> None:
    if not path.endswith(SUFFIXES):
        raise TextInputError(f"{path}: unknown format; inputs are {', '.join(SUFFIXES)}")
    if not os.path.isfile(path):
        raise TextInputError(f"{path}: no such file")


class InputReader:
    def __init__(self, path: str, text_key: str) -> None:
        check_input(path)
        self.path, self.text_key = path, text_key
        self.size = os.path.getsize(path)
        self._raw: IO[bytes] | None = None
        self._fraction = 0.0

    def bytes_read(self) -> int:
        if self._raw is not None and not self._raw.closed:
            return self._raw.tell()
        return int(self._fraction * self.size)

    def items(self) -> Iterator[tuple[int, Any]]:
        """(1-based line or row number, item) in file order."""
        if self.path.endswith(".parquet"):
            yield from self._parquet()
            return
        with open(self.path, "rb") as raw:
            self._raw = raw
            lines: IO[bytes] = raw
            if self.path.endswith(".gz"):
                lines = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]  # a binary file, as IO[bytes] is
            elif self.path.endswith(".zst"):
                import zstandard

                lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
            number = 0
            try:
                for number, line in enumerate(lines, 1):
                    yield number, line
            except (OSError, EOFError, zlib.error) as e:
                raise TextInputError(f"{self.path}: the compressed stream is damaged after line {number} ({e}); "
                                 "restore the file or drop it from --input") from None
            except Exception as e:  # zstandard.ZstdError: its module is imported only for .zst
                if type(e).__name__ != "ZstdError":
                    raise
                raise TextInputError(f"{self.path}: the zstd stream is damaged after line {number} ({e}); restore the "
                                 "file or drop it from --input") from None
        self._fraction = 1.0

    def _parquet(self) -> Iterator[tuple[int, Any]]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise TextInputError(f"{self.path}: reading parquet needs pyarrow: {PARQUET_EXTRA}") from None
        try:
            table = pq.ParquetFile(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise TextInputError(f"{self.path}: not a readable parquet file ({e})") from None
        names = table.schema_arrow.names
        if self.text_key not in names:
            raise TextInputError(f"{self.path}: no column {self.text_key!r} (columns: {', '.join(names)}); use --text-key")
        total = max(table.metadata.num_rows, 1)
        row = 0
        for batch in table.iter_batches(batch_size=8192, columns=[self.text_key]):
            for value in batch.column(0).to_pylist():
                row += 1
                yield row, value
            self._fraction = row / total
        self._fraction = 1.0
