"""Where trials run: local processes (`cluster=local`) or Slurm jobs (`cluster=slurm`). Start one,
ask whether it has ended, cancel it, find the ones still running after a controller restart.

Local trials die with the controller (they get SIGTERM, save and exit 75), and the restarted
controller resumes them; Slurm jobs outlive it and are re-attached by job id.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from resilient_slurm.rundir import RunDir
from resilient_slurm.config import Config
from resilient_slurm.launch.submit import submit
from resilient_slurm.slurm import scontrol

_PR_SET_PDEATHSIG = 1
# A job in any other state has ended (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ..., GONE).
_LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
                "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


@dataclass
class Handle:
    """A started trial: a Slurm job id, or a local launcher's pid (with its Popen if it is our child)."""

    job: str | None = None
    pid: int | None = None
    run_dir: Path | None = None
    """Local: the run the pid must still be running (pids are reused)."""
    proc: subprocess.Popen[bytes] | None = None


class Backend(Protocol):
    def start(self, cfg: Config, run_dir: Path) -> Handle: ...

    def ended(self, handle: Handle) -> str | None:
        """None while it runs (or nobody can tell); else how it ended, in words."""

    def cancel(self, handle: Handle) -> tuple[bool, str]: ...

    def running(self, run_dir: Path, known: list[Handle]) -> list[Handle]:
        """The run's jobs or processes still alive, among `known` and any found by other means."""


class LocalBackend:
    def start(self, cfg: Config, run_dir: Path) -> Handle:
        log = open(RunDir(run_dir).logs / "launcher.log", "ab")  # noqa: SIM115 - the child owns it from here
        try:
            proc = subprocess.Popen([sys.executable, "-m", "resilient_slurm.supervise.local", str(run_dir)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_term_with_parent)
        finally:
            log.close()
        return Handle(pid=proc.pid, run_dir=run_dir, proc=proc)

    def ended(self, handle: Handle) -> str | None:
        if handle.proc is not None:
            code = handle.proc.poll()
            return None if code is None else f"exit status {code}"
        return None if _is_launcher_of(handle.pid, handle.run_dir) else "gone"

    def cancel(self, handle: Handle) -> tuple[bool, str]:
        try:
            if handle.pid is not None:
                os.kill(handle.pid, signal.SIGTERM)  # the launcher passes it on; every rank saves and exits
            return True, ""
        except ProcessLookupError:
            return True, "already gone"

    def running(self, run_dir: Path, known: list[Handle]) -> list[Handle]:
        # A launcher of the controller before this one: SIGTERMed when it died, maybe still saving.
        return [Handle(pid=h.pid, run_dir=run_dir) for h in known if _is_launcher_of(h.pid, run_dir)]


class SlurmBackend:
    def start(self, cfg: Config, run_dir: Path) -> Handle:
        return Handle(job=submit(cfg, run_dir))

    def ended(self, handle: Handle) -> str | None:
        assert handle.job is not None
        ok, state = scontrol.job_state(handle.job)
        if not ok or state in _LIVE_STATES:
            return None
        return f"job {handle.job} {state}"

    def cancel(self, handle: Handle) -> tuple[bool, str]:
        assert handle.job is not None
        return scontrol.cancel(handle.job)

    def running(self, run_dir: Path, known: list[Handle]) -> list[Handle]:
        # Jobs are named after their run (launch/submit.py): one submitted just before the controller
        # died, and never recorded, is found too.
        _, named = scontrol.jobs_named(run_dir.name)
        ids = {h.job for h in known if h.job} | set(named)
        return [Handle(job=j) for j in sorted(ids, key=int) if _job_alive(j)]


def _job_alive(job: str) -> bool:
    ok, state = scontrol.job_state(job)
    return not ok or state in _LIVE_STATES


def _is_launcher_of(pid: int | None, run_dir: Path | None = None) -> bool:
    """The pid is alive and still a local launcher (of this run): pids are reused."""
    if pid is None:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"resilient_slurm.supervise.local" in argv and (run_dir is None or str(run_dir).encode() in argv)


def _term_with_parent() -> None:
    """A local trial gets SIGTERM when its controller dies: it saves, and the next controller resumes it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
