"""`cluster=local`: run the job on this machine, one process per rank (one rank too: the launcher
never imports torch, and Ctrl-C works the same at any size).

The launcher passes stop signals on to every rank (Ctrl-C included: every rank saves the same step
and the run exits 75; a second Ctrl-C within 5 s kills the ranks at once, recorded as
`forced_exit`), and makes sure a rank that dies does not leave the others blocked in a collective:
once any rank has exited, the rest get `kill_grace_s` to follow before they are killed. Ranks die
with the launcher (PR_SET_PDEATHSIG), so a SIGKILL of the launcher never leaves orphans holding
memory. A rank the kernel's OOM killer took is recorded
as `host_oom`, with the kernel-log line or cgroup counter that shows it (health/oom_kill.py).

`python -m resilient_slurm.supervise.local RUN_DIR` runs an already-prepared run directory (a
search's local trials: the controller prepares the directory, this runs it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from resilient_slurm.analysis.rank_ends import ending_line, resume_step
from resilient_slurm.rundir import RunDir
from resilient_slurm.config import Config
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health.oom_kill import judge_exit
from resilient_slurm.health.oom_watch import OomWatch, memory_cgroup_dirs
from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import EventLog, ForcedExit, HostOom, RankExit, RanksKilled, Stop, read_events, read_new_events, select
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.session.heartbeat import HEARTBEAT_ENV
from resilient_slurm.session.rejoin import PEER_GONE
from resilient_slurm.process.signals import FORCE_WINDOW_S, STOP_SIGNALS, Forwarder, forward_signals, stop_signals_held
from resilient_slurm.supervise.hangs import record_silence
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor

_PR_SET_PDEATHSIG = 1


def run_local(cfg: Config, run_dir: Path) -> int:
    n = cfg.cluster.ranks
    port = _free_port()
    # Started before the ranks: only OOM kills after this count. Ranks start in this cgroup.
    kernel_log = cfg.health.kernel_log.replace("%n", os.uname().nodename) if cfg.health.kernel_log else None
    watch = OomWatch(memory_cgroup_dirs(), kernel_log)
    ledger = RunDir(run_dir).events
    since = ledger.stat().st_size if ledger.exists() else 0
    procs: list[subprocess.Popen] = []
    # A Ctrl-C meanwhile reaches every rank, once all exist. The monitor's thread is started inside
    # too, so that it inherits the block: the kernel hands a process's signal to any thread that
    # does not block it, and Python then runs the handler of the moment in the main thread.
    with stop_signals_held():
        monitor = HeartbeatMonitor("127.0.0.1", cfg.monitor.heartbeat_timeout_s, cfg.monitor.heartbeat_phase_s) \
            if cfg.monitor.heartbeat_timeout_s > 0 else None
        for rank in range(n):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if monitor is not None:
                env[HEARTBEAT_ENV] = monitor.address
            procs.append(subprocess.Popen([sys.executable, "-m", "resilient_slurm.runtime.rank", str(run_dir)],
                                          env=env, preexec_fn=_die_with_parent))
        forwarder = forward_signals(STOP_SIGNALS, lambda signum: _forward(procs, signum))
    try:
        codes = _supervise(procs, cfg.cluster.kill_grace_s, EventLog(ledger, rank=-1), watch, forwarder, monitor,
                           run_dir, since)
    finally:
        if monitor is not None:
            monitor.close()
    code = combine_exit_codes(codes)
    if code == ExitCode.FAILED:
        say_how_it_ended(ledger, since, n)
    return code


def say_how_it_ended(ledger: Path, since: int, ranks: int) -> None:
    """One line on the console for a failed run: the rank that ended it, how, and where a relaunch
    resumes; each rank's traceback stays in its log (`since`: where this launch's events begin)."""
    line = ending_line(read_new_events(ledger, since)[0], ranks, resume_step(read_events(ledger)),
                       lambda error: any(m in error for m in PEER_GONE))
    if line:
        print(line, file=sys.stderr, flush=True)


def combine_exit_codes(codes: list[int]) -> int:
    """One status for the run: any crash wins, then a stop-to-resume, else done; every rank
    refusing its config, or giving up together, says so. Pure."""
    if any(c not in (ExitCode.DONE, ExitCode.RESUME) for c in codes):
        for agreed in (ExitCode.CONFIG, ExitCode.GAVE_UP, ExitCode.INTERRUPTED):
            if all(c == agreed for c in codes):
                return agreed
        return ExitCode.FAILED
    return ExitCode.RESUME if ExitCode.RESUME in codes else ExitCode.DONE


def _supervise(procs: list[subprocess.Popen], grace_s: float, events: EventLog, watch: OomWatch,
               forwarder: Forwarder | None = None, monitor: HeartbeatMonitor | None = None,
               run_dir: Path | None = None, since: int = 0) -> list[int]:
    """Until every rank has exited; a rank the heartbeats find silent ends them all, as a hang.
    `since`: where this launch's events begin in the ledger."""
    deadline: float | None = None
    reported: set[int] = set()
    killed: set[int] = set()  # ranks this launcher SIGKILLed itself: no OOM killer took them
    while True:
        if forwarder is not None and forwarder.forced_at is not None:
            return _exit_at_once(procs, forwarder, events, since)
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code is not None and code not in (ExitCode.DONE, ExitCode.RESUME) and rank not in reported:
                reported.add(rank)
                events.emit(RankExit(failed_rank=rank, returncode=code), None)
                verdict = None if rank in killed else \
                    judge_exit(code, procs[rank].pid, watch.kills(), watch.before, watch.counters())
                if verdict:
                    events.emit(HostOom(killed_rank=rank, pid=verdict.pid, source=verdict.source,
                                        evidence=verdict.evidence), None)
        if all(c is not None for c in codes):
            return [c for c in codes if c is not None]
        silent = monitor.silent(r for r, c in enumerate(codes) if c is None) if monitor and deadline is None else []
        if silent and run_dir is not None:
            hung = culprits(silent)
            for s in hung:
                record_silence(run_dir, s, procs[s.rank].pid, {})
            stuck = [r for r, c in enumerate(codes) if c is None]
            events.emit(RanksKilled(ranks=stuck, reason=f"hung: {hung[0].describe()}"), None)
            _signal_all(procs, signal.SIGKILL)
            killed.update(stuck)
            deadline = float("inf")
        if any(c is not None for c in codes) and deadline is None:
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            stuck = [r for r, c in enumerate(codes) if c is None]
            events.emit(RanksKilled(ranks=stuck, reason=f"still running {grace_s:.0f}s after another rank exited"), None)
            _signal_all(procs, signal.SIGKILL)
            killed.update(stuck)
            deadline = float("inf")
        time.sleep(0.1)


_CTRL_C = (f"resilient_slurm: Ctrl-C: every rank saves at the end of its step, then the run exits "
           f"{int(ExitCode.RESUME)}; Ctrl-C again within {FORCE_WINDOW_S:.0f} s stops at once without saving\n").encode()


def _forward(procs: list[subprocess.Popen], signum: int) -> None:
    if signum == signal.SIGINT:
        # Said from the handler, before any rank can say that it saved; os.write, because a
        # buffered print could be interrupted by this very handler.
        os.write(sys.stderr.fileno(), _CTRL_C)
    _signal_all(procs, signum)


def _exit_at_once(procs: list[subprocess.Popen], forwarder: Forwarder, events: EventLog, since: int) -> list[int]:
    """A second Ctrl-C: the ranks still running are killed, which the ledger records. What is said
    is what happened: the first Ctrl-C's save may have finished already (the ranks were shutting
    down), and then the run exits as a stop does, 75, to resume from that save."""
    running = [rank for rank, p in enumerate(procs) if p.poll() is None]
    _signal_all(procs, signal.SIGKILL)
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


def _signal_all(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.supervise.local RUN_DIR`: run a prepared run directory here."""
    from resilient_slurm.rundir.identity import load_config

    if len(argv) != 1:
        print("usage: python -m resilient_slurm.supervise.local RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    run_dir = Path(argv[0])
    return run_local(load_config(run_dir), run_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
