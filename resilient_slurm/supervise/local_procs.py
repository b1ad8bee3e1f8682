"""The local launcher's process plumbing, with or without replica groups: a rank's process that dies
with the launcher, a free port, stop signals passed on (Ctrl-C said at once), the second Ctrl-C,
and one exit status from the ranks'."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import EventLog, ForcedExit, Stop, read_new_events, select
from resilient_slurm.process.signals import FORCE_WINDOW_S, Forwarder

_PR_SET_PDEATHSIG = 1

_CTRL_C = (f"resilient_slurm: Ctrl-C: every rank saves at the end of its step, then the run exits "
           f"{int(ExitCode.RESUME)}; Ctrl-C again within {FORCE_WINDOW_S:.0f} s stops at once without saving\n").encode()


def forward(procs: list[subprocess.Popen], signum: int) -> None:
    if signum == signal.SIGINT:
        # Said from the handler, before any rank can say that it saved; os.write, because a
        # buffered print could be interrupted by this very handler.
        os.write(sys.stderr.fileno(), _CTRL_C)
    signal_all(procs, signum)


def exit_at_once(procs: list[subprocess.Popen], forwarder: Forwarder, events: EventLog, since: int) -> list[int]:
    """A second Ctrl-C: the ranks still running are killed, which the ledger records. What is said
    is what happened: the first Ctrl-C's save may have finished already (the ranks were shutting
    down), and then the run exits as a stop does, 75, to resume from that save."""
    running = [rank for rank, p in enumerate(procs) if p.poll() is None]
    signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()
    assert forwarder.interrupted_at is not None and forwarder.forced_at is not None
    events.emit(ForcedExit(first=utc_stamp(forwarder.interrupted_at), second=utc_stamp(forwarder.forced_at),
                           ranks=running), None)
    saved = [e for e in select(read_new_events(events.path, since)[0], Stop) if e.details.checkpoint]
    if saved:
        print(f"resilient_slurm: second Ctrl-C: stopped at once; the emergency save of step {saved[-1].step} had "
              f"already finished, so launch again to resume from it", file=sys.stderr, flush=True)
        return [ExitCode.RESUME] * len(procs)
    print("resilient_slurm: second Ctrl-C: stopped at once, without saving; launch again to resume from the "
          "newest checkpoint", file=sys.stderr, flush=True)
    return [ExitCode.INTERRUPTED] * len(procs)


def signal_all(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def combine_exit_codes(codes: list[int]) -> int:
    """One status for the run: any crash wins, then a stop-to-resume, else done; every rank
    refusing its config, or giving up together, says so. Pure."""
    if any(c not in (ExitCode.DONE, ExitCode.RESUME) for c in codes):
        for agreed in (ExitCode.CONFIG, ExitCode.GAVE_UP, ExitCode.INTERRUPTED):
            if all(c == agreed for c in codes):
                return agreed
        return ExitCode.FAILED
    return ExitCode.RESUME if ExitCode.RESUME in codes else ExitCode.DONE
