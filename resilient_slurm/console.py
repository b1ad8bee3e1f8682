"""What the commands write for a person to read: progress on long work, and output piped on.

`progress(total, desc)` is one tqdm bar for everything that takes minutes (evaluation, an export,
a search's trials, the simulator's seeds). On a terminal it is tqdm's bar, redrawn in place; on
anything else (a log file, a Slurm job's output, a pipe) tqdm's `\\r` redraws would pile up into one
unreadable line, so each update is written as a line of its own, at most every `LOG_INTERVAL_S`,
and the log stays readable. tqdm's monitor thread is off: ranks already run enough threads.

`LOG_ONLY` marks a log record for the log file alone (`log.info(..., extra=LOG_ONLY)`): what a user
needs only when something went wrong, kept off the console (`on_console` is the handler's filter).

`say(line)` prints a line beside a bar without garbling it. `pipe_safe(main)` lets a command's output go into `head`: when the reader closes the pipe early,
the command ends quietly instead of with a BrokenPipeError traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from tqdm import tqdm

LOG_ONLY = {"log_only": True}
"""`extra=` of a log call whose line goes to the log file only, not to the console."""

LOG_INTERVAL_S = 10.0
"""Off a terminal: at most one progress line this often (and one at the end)."""
DEFAULT_COLUMNS = 80
"""A bar's width on a terminal that reports no size."""


class _Bar(tqdm):  # type: ignore[type-arg]
    monitor_interval = 0


class _Lines:
    """A stream for tqdm that turns each in-place redraw into a line of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.last = ""

    def write(self, text: str) -> None:
        for line in text.replace("\r", "\n").split("\n"):
            line = line.rstrip()
            if line and line != self.last:
                self.stream.write(line + "\n")
                self.last = line

    def flush(self) -> None:
        self.stream.flush()


def progress(total: int | None, desc: str, *, unit: str = "it", enabled: bool = True,
             stream: IO[str] | None = None, leave: bool = True) -> tqdm:  # type: ignore[type-arg]
    """A progress bar (tqdm's API: `update`, `set_postfix_str`, `close`, a context manager) on
    `stream` (default stderr); `enabled=False` (another rank's, say) writes nothing."""
    out = stream or sys.stderr
    if _is_terminal(out):
        # A terminal that reports no size (some containers' ttys, a fresh pty) would get a bar of no
        # columns, which tqdm draws as nothing; and a description wider than the terminal leaves no
        # room for the bar. Either way the user saw no bar: give it 80 columns and a description
        # that fits in half of them.
        columns = _columns(out)
        sized = columns > 0
        columns = columns if sized else DEFAULT_COLUMNS
        return _Bar(total=total, desc=_fit(desc, columns // 2), unit=unit, file=out, disable=not enabled, leave=leave,
                    dynamic_ncols=sized, ncols=None if sized else columns)
    shape = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left{postfix}" \
        if total else "{desc}: {n_fmt} {unit}, {elapsed} elapsed{postfix}"
    return _Bar(total=total, desc=desc, unit=unit, file=_Lines(out), disable=not enabled, mininterval=LOG_INTERVAL_S,
                bar_format=shape, ascii=True)


def on_console(record: logging.LogRecord) -> bool:
    """A console handler's filter: every record but the `LOG_ONLY` ones."""
    return not getattr(record, "log_only", False)


def say(line: str) -> None:
    """A line on stdout that a progress bar on the same terminal does not garble."""
    _Bar.write(line, file=sys.stdout)
    sys.stdout.flush()


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _fit(text: str, width: int) -> str:
    """`text`, its middle cut out when it is longer than `width` (a long path keeps both ends)."""
    if len(text) <= width or width < 9:
        return text
    keep = width - 3
    return f"{text[:keep // 2]}...{text[len(text) - (keep - keep // 2):]}"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def pipe_safe(main: Callable[..., Any]) -> Callable[..., Any]:
    """`main`, ending with status 0 and no traceback when its reader closes stdout (`| head`)."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = main(*args, **kwargs)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            # Python flushes stdout again at exit and would fail there too: point it at /dev/null.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return run
