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

import os
import signal
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
from resilient_slurm.ledger import EventLog, HostOom, RankExit, RanksKilled, read_events, read_new_events
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.session.rejoin import PEER_GONE
from resilient_slurm.process.signals import STOP_SIGNALS, Forwarder, forward_signals, stop_signals_held
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.supervise.hangs import record_hang
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor
from resilient_slurm.supervise.local_groups import run_local_groups
from resilient_slurm.supervise.local_procs import combine_exit_codes
from resilient_slurm.supervise.local_procs import die_with_parent as _die_with_parent
from resilient_slurm.supervise.local_procs import exit_at_once as _exit_at_once
from resilient_slurm.supervise.local_procs import forward as _forward
from resilient_slurm.supervise.local_procs import free_port as _free_port
from resilient_slurm.supervise.local_procs import signal_all as _signal_all
from resilient_slurm.supervise.stragglers import record_straggler


def run_local(cfg: Config, run_dir: Path) -> int:
    if cfg.cluster.replica_ft:
        return run_local_groups(cfg, run_dir)
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
        monitor = HeartbeatMonitor("127.0.0.1", cfg.monitor) if cfg.monitor.heartbeat_timeout_s > 0 else None
        if monitor is not None:
            monitor.restart(0, n)
        for rank in range(n):
            launch = RankLaunch(run_dir=str(run_dir), rank=rank, world_size=n, local_rank=rank, local_world_size=n,
                                master_addr="127.0.0.1", master_port=port,
                                heartbeat=monitor.address if monitor is not None else "")
            procs.append(subprocess.Popen([sys.executable, "-m", "resilient_slurm.runtime.rank", str(run_dir)],
                                          env={**os.environ, **launch.to_env()}, preexec_fn=_die_with_parent))
        forwarder = forward_signals(STOP_SIGNALS, lambda signum: _forward(procs, signum))
    try:
        codes = _supervise(procs, cfg.cluster.kill_grace_s, EventLog(ledger, rank=-1), watch, forwarder, monitor,
                           run_dir, since, cfg.health.node_record)
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


def _supervise(procs: list[subprocess.Popen], grace_s: float, events: EventLog, watch: OomWatch,
               forwarder: Forwarder | None = None, monitor: HeartbeatMonitor | None = None,
               run_dir: Path | None = None, since: int = 0, node_record: str | None = None) -> list[int]:
    """Until every rank has exited; a rank the heartbeats find hung ends them all, as a hang; a
    straggler is recorded. `since`: where this launch's events begin in the ledger."""
    deadline: float | None = None
    here = os.uname().nodename
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
        running = [r for r, c in enumerate(codes) if c is None]
        if monitor is not None and run_dir is not None:
            for found in monitor.stragglers():
                record_straggler(run_dir, found, here, {}, "report", node_record)
        silent = monitor.silent(running) if monitor and deadline is None else []
        if silent and monitor is not None and run_dir is not None:
            front = monitor.wavefront(range(len(procs)))
            hung = culprits(silent, front)
            gone = {s.rank for s in silent if not s.alive}
            record_hang(run_dir, hung, front, [r for r in running if r not in gone], dict.fromkeys(running, here),
                        {s.rank: procs[s.rank].pid for s in hung}, {}, node_record)
            stuck = running
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
