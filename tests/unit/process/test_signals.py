"""Signals: Ctrl-C is a stop request; a second one within the window is a forced exit; a signal
that arrives while a rank starts up waits for its handlers (real signals, in a child process)."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.process.signals import FORCE_WINDOW_S, STOP_SIGNALS, Forwarder, forced

REPO = Path(__file__).resolve().parents[3]


def test_ctrl_c_is_one_of_the_stop_signals():
    assert signal.SIGINT in STOP_SIGNALS and signal.SIGTERM in STOP_SIGNALS


@pytest.mark.parametrize("first, now, expected", [
    (None, 100.0, False),                    # the first Ctrl-C
    (100.0, 100.3, True),                    # again at once
    (100.0, 100.0 + FORCE_WINDOW_S, True),   # at the window's edge
    (100.0, 106.0, False),                   # later: another stop request, a new window
])
def test_a_second_ctrl_c_within_the_window_forces(first, now, expected):
    assert forced(first, now) is expected


def test_the_forwarder_passes_stops_on_and_marks_the_second_ctrl_c_instead():
    sent = []
    f = Forwarder(sent.append)
    f.handle(signal.SIGTERM)
    f.handle(signal.SIGINT)
    assert sent == [signal.SIGTERM, signal.SIGINT] and f.interrupted_at is not None and f.forced_at is None
    f.handle(signal.SIGINT)
    assert sent == [signal.SIGTERM, signal.SIGINT] and f.forced_at is not None


def test_a_signal_held_while_a_process_starts_is_recorded_once_it_handles_them():
    """The launcher's block, inherited across exec: SIGINT sent before the child's handlers exist
    neither kills it nor is lost."""
    child = ("import os, signal, sys, time\n"
             "from resilient_slurm.process.signals import install_stop_handlers\n"
             "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
             # Until the parent's SIGINT is pending here (held by the inherited block): without the block a
             # Python process would die of KeyboardInterrupt before its handlers exist.
             "while signal.SIGINT not in signal.sigpending():\n"
             "    time.sleep(0.01)\n"
             "stop = install_stop_handlers()\n"
             "print(stop.signal_name)\n")
    code = ("import signal, subprocess, sys\n"
            "from resilient_slurm.process.signals import stop_signals_held\n"
            "with stop_signals_held():\n"
            f"    p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
            "p.stdout.readline()\n"
            "p.send_signal(signal.SIGINT)\n"
            "out, _ = p.communicate(timeout=60)\n"
            "print(p.returncode, out.strip())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "0 SIGINT", done.stdout + done.stderr
