"""Progress off a terminal is one plain line per update; a closed pipe ends a command quietly."""

import io
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm import console

REPO = Path(__file__).resolve().parents[2]


def test_off_a_terminal_each_update_is_a_line_of_its_own(monkeypatch):
    monkeypatch.setattr(console, "LOG_INTERVAL_S", 0.0)
    out = io.StringIO()
    with console.progress(3, "evaluating at step 100", unit="batch", stream=out) as bar:
        for _ in range(3):
            bar.set_postfix_str("best 0.5", refresh=False)
            bar.update()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4  # the start, then each update
    assert lines[0].startswith("evaluating at step 100: 0/3 batch (0%), 00:00 elapsed")
    assert lines[-1].startswith("evaluating at step 100: 3/3 batch (100%), 00:00 elapsed, 00:00 left, best 0.5")


def test_off_a_terminal_updates_are_at_most_one_line_per_interval():
    out = io.StringIO()
    with console.progress(1000, "simulating", unit="run", stream=out) as bar:
        for _ in range(1000):
            bar.update()
    assert len(out.getvalue().splitlines()) == 2  # the start and the end: all in well under LOG_INTERVAL_S


def test_a_disabled_bar_writes_nothing():
    out = io.StringIO()
    with console.progress(3, "x", stream=out, enabled=False) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_a_command_piped_into_a_reader_that_left_ends_quietly():
    code = ("import sys; from resilient_slurm.console import pipe_safe\n"
            "@pipe_safe\n"
            "def main():\n"
            "    for i in range(100000): print('line', i)\n"
            "    return 0\n"
            "sys.exit(main())\n")
    done = subprocess.run(f"{sys.executable} -c \"{code}\" | head -n 1; echo ${{PIPESTATUS[0]}}", shell=True,
                          executable="/bin/bash", cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout == "line 0\n0\n" and done.stderr == "", done.stderr


def on_a_terminal(argv: list[str], columns: int, env: dict[str, str] | None = None) -> bytes:
    """What `argv` writes to a real terminal (a pty from Python's `pty` module; `columns` 0: one that
    reports no size, as some containers' ttys do), read until it exits."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the pty
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        os.chdir(REPO)
        os.execve(argv[0], argv, {**os.environ, **(env or {})})
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks)


BAR = ("import time; from resilient_slurm.console import progress\n"
       "with progress(4, 'exporting step_00000050 to /a/long/path/' + 'x' * 120, unit='tensor') as bar:\n"
       "    for _ in range(4):\n"
       "        time.sleep(0.15)\n"  # tqdm redraws at most every 0.1 s: these are four redraws, not pacing
       "        bar.update()\n")


@pytest.mark.parametrize("columns", [100, 0])
def test_on_a_terminal_a_bar_is_drawn_in_place_even_with_a_long_description_or_no_terminal_size(columns):
    """Issue 27, item 14: a description wider than the terminal, or a terminal of no reported size,
    left tqdm no room for a bar: the user saw none."""
    out = on_a_terminal([sys.executable, "-c", BAR], columns).decode()
    final = out.replace("\r\n", "\n").split("\r")[-1].strip()
    assert "100%|" in final and "█" in final and "4/4" in final, out
    assert len(final) <= (columns or console.DEFAULT_COLUMNS)
    assert out.count("\r") >= 2  # redrawn in place, not a line per update
