"""A progress bar (tqdm, the project's one progress library) that suits a terminal and a log.

On a terminal it redraws in place. When stdout is not a terminal (a Slurm job's output file, a
pipe), each update is one whole line, at most one every `LOG_EVERY_S`, so a log holds readable
progress instead of carriage returns.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from tqdm import tqdm

LOG_EVERY_S = 10.0


class _Lines:
    """A file for tqdm that turns each redraw into one line."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.out.write(text + "\n")

    def flush(self) -> None:
        self.out.flush()


def progress_bar(total: int, desc: str, enabled: bool = True, out: IO[str] | None = None, **kwargs: Any) -> tqdm:
    out = out or sys.stdout
    if out.isatty():
        return tqdm(total=total, desc=desc, disable=not enabled, file=out, **kwargs)
    return tqdm(total=total, desc=desc, disable=not enabled, file=_Lines(out), mininterval=LOG_EVERY_S,
                ascii=True, dynamic_ncols=False, ncols=120, **kwargs)
