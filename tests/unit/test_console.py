"""Progress off a terminal is one plain line per update; a closed pipe ends a command quietly."""

import io
import subprocess
import sys
from pathlib import Path

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
