"""`cluster=local` with replica groups (cluster.replica_ft): each group's ranks are a process group of
their own (their own store and port), the groups meet at a lighthouse this launcher runs, and a
group that fails is the only one that stops.

When a rank of group g exits abnormally, or goes silent (its heartbeats), the rest of g is killed
at once, and g starts anew in place (this machine has no spare): its new processes heal from a live
group over the network, and join at a step boundary. The other groups never stop: they drop the
step they were in, and go on without g, taking its micro-batches, until it joins. Going on is
refused (`replica.plan.refusal`: every group lost at once, no live group left, fewer than
cluster.replica_min, or a replacement that failed before it joined): the ledger says why, every
rank is killed, and the run ends failed, as a local run does after any failure; launching it again
resumes from the newest checkpoint.

Stop signals reach every rank, as without groups (local.py's forwarding, the second Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import EventLog, RankExit, RanksKilled, ReplicaJoin, ReplicaRefused, read_new_events
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.process.signals import STOP_SIGNALS, Forwarder, forward_signals, stop_signals_held
from resilient_slurm.replica import plan
from resilient_slurm.replica.lighthouse import Lighthouse
from resilient_slurm.rundir import RunDir
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.supervise.hangs import record_hang
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor
from resilient_slurm.supervise.stragglers import record_straggler
from resilient_slurm.supervise.local_procs import combine_exit_codes, die_with_parent, exit_at_once, forward, free_port

POLL_S = 0.1
ORDERLY = (ExitCode.DONE, ExitCode.RESUME)
AT_ONCE_S = 1.0
"""Groups that fail within this of each other failed at once (one node's loss, one cause)."""


class LocalGroups:
    def __init__(self, cfg: Config, run_dir: Path, lighthouse: str, monitor: HeartbeatMonitor | None) -> None:
        self.cfg, self.run_dir, self.lighthouse, self.monitor = cfg, run_dir, lighthouse, monitor
        self.groups = cfg.parallel.dp_replicate
        self.size = cfg.cluster.ranks // self.groups
        self.procs: list[subprocess.Popen[bytes]] = []
        self.joining: set[int] = set()
        """Groups whose replacement has not joined yet (its ReplicaJoin is not in the ledger)."""
        self.events = EventLog(RunDir(run_dir).events, rank=-1)
        self._began_at = RunDir(run_dir).events.stat().st_size if RunDir(run_dir).events.exists() else 0
        self._ledger_at = self._began_at

    def start(self, group: int, heal: bool) -> None:
        port, n = free_port(), self.cfg.cluster.ranks
        for local in range(self.size):
            rank = group * self.size + local
            launch = RankLaunch(run_dir=str(self.run_dir), rank=local, world_size=self.size, local_rank=rank,
                                local_world_size=n, master_addr="127.0.0.1", master_port=port,
                                heartbeat=self.monitor.address if self.monitor is not None else "",
                                replica_group=group, replica_heal=heal, lighthouse=self.lighthouse)
            proc = subprocess.Popen([sys.executable, "-m", "resilient_slurm.runtime.rank", str(self.run_dir)],
                                    env={**os.environ, **launch.to_env()}, preexec_fn=die_with_parent)
            if rank < len(self.procs):
                self.procs[rank] = proc
            else:
                self.procs.append(proc)
        if heal:
            self.joining.add(group)
            if self.monitor is not None:
                self.monitor.restart_ranks(range(group * self.size, (group + 1) * self.size))

    def supervise(self, forwarder: Forwarder | None) -> list[int]:
        """Until every rank has exited; a failed group is replaced, or the whole run ends."""
        reported: set[int] = set()
        dropped: set[int] = set()
        """Ranks of a group that failed after the others had ended the run: not the run's outcome."""
        deadline: float | None = None
        while True:
            if forwarder is not None and forwarder.forced_at is not None:
                return exit_at_once(self.procs, forwarder, self.events, self._began_at)
            self._joined()
            codes = [p.poll() for p in self.procs]
            failed = self._exited(reported)
            failed |= self._hung(codes, failed)
            self._stragglers()
            if failed:
                time.sleep(AT_ONCE_S)
                failed |= self._exited(reported)
                members = [r for g in failed for r in range(g * self.size, (g + 1) * self.size)]
                if all(p.poll() in ORDERLY for r, p in enumerate(self.procs) if r not in members):
                    self._kill(members)  # the others ended the run in order: nothing left to join
                    dropped.update(members)
                    continue
                refused = self._replace(failed)
                if refused:
                    return [p.wait() for p in self.procs]
                reported -= {r for g in failed for r in range(g * self.size, (g + 1) * self.size)}
                continue
            if all(c is not None for c in codes):
                return [c for r, c in enumerate(codes) if c is not None and r not in dropped]
            if deadline is None and any(c is not None for c in codes):
                deadline = time.monotonic() + self.cfg.cluster.kill_grace_s  # an orderly end: the rest follow
            if deadline is not None and time.monotonic() > deadline:
                stuck = [r for r, c in enumerate(codes) if c is None]
                self.events.emit(RanksKilled(ranks=stuck, reason=f"still running {self.cfg.cluster.kill_grace_s:.0f}s "
                                                                  f"after another rank exited"), None)
                self._kill(stuck)
                deadline = float("inf")
            time.sleep(POLL_S)

    def _exited(self, reported: set[int]) -> set[int]:
        """Groups with a rank that exited abnormally since the last look (each one recorded)."""
        failed = set()
        for rank, p in enumerate(self.procs):
            code = p.poll()
            if code is not None and code not in ORDERLY and rank not in reported:
                reported.add(rank)
                self.events.emit(RankExit(failed_rank=rank, returncode=code), None)
                failed.add(rank // self.size)
        return failed

    def _stragglers(self) -> None:
        """Recorded only: this machine has no spare to move a group to."""
        if self.monitor is None:
            return
        for found in self.monitor.stragglers():
            record_straggler(self.run_dir, found, os.uname().nodename, {}, "report", self.cfg.health.node_record,
                             group=found.rank // self.size)

    def _hung(self, codes: list[int | None], failed: set[int]) -> set[int]:
        """Groups with a rank the heartbeats find silent (its culprit's stacks and `hang` recorded)."""
        if self.monitor is None:
            return set()
        running = [r for r, c in enumerate(codes) if c is None and r // self.size not in failed]
        silent = self.monitor.silent(running)
        if not silent:
            return set()
        front = self.monitor.wavefront(running)
        hung = culprits(silent, front)
        here = os.uname().nodename
        record_hang(self.run_dir, hung, front, running, dict.fromkeys(running, here),
                    {s.rank: self.procs[s.rank].pid for s in hung}, {}, self.cfg.health.node_record)
        return {s.rank // self.size for s in hung}

    def _replace(self, failed: set[int]) -> str | None:
        """Kill what is left of the failed groups; start each anew (it heals), or refuse and end all."""
        members = [r for g in failed for r in range(g * self.size, (g + 1) * self.size)]
        self._kill(members)
        again = sorted(failed & self.joining)
        refused = plan.refusal(self.groups, failed, self.joining - failed, self.cfg.cluster.replica_min)
        if refused is None and again:
            refused = f"replica group(s) {', '.join(map(str, again))} failed again before joining"
        if refused:
            self.events.emit(ReplicaRefused(groups=sorted(failed), reason=refused), None)
            print(f"resilient_slurm: {refused}: every rank stops; launch again to resume from the newest checkpoint",
                  file=sys.stderr, flush=True)
            self._kill(range(len(self.procs)))
            return refused
        for g in sorted(failed):
            self.start(g, heal=True)
        return None

    def _joined(self) -> None:
        if not self.joining:
            return
        news, self._ledger_at = read_new_events(RunDir(self.run_dir).events, self._ledger_at)
        for e in news:
            if isinstance(e.details, ReplicaJoin):
                self.joining.discard(e.details.group)

    def _kill(self, ranks: range | list[int]) -> None:
        for r in ranks:
            if self.procs[r].poll() is None:
                self.procs[r].send_signal(signal.SIGKILL)
        for r in ranks:
            self.procs[r].wait()


def run_local_groups(cfg: Config, run_dir: Path) -> int:
    lighthouse = Lighthouse(cfg.cluster.replica_min, cfg.cluster.replica_timeout_s)
    try:
        # As local.py: the monitor's thread and the forwarding inherit the held stop signals.
        with stop_signals_held():
            monitor = HeartbeatMonitor("127.0.0.1", cfg.monitor) if cfg.monitor.heartbeat_timeout_s > 0 else None
            if monitor is not None:
                monitor.restart(0, cfg.cluster.ranks)
            run = LocalGroups(cfg, run_dir, lighthouse.address, monitor)
            for g in range(run.groups):
                run.start(g, heal=False)
            forwarder = forward_signals(STOP_SIGNALS, lambda signum: forward(run.procs, signum))
        try:
            codes = run.supervise(forwarder)
        finally:
            if monitor is not None:
                monitor.close()
    finally:
        lighthouse.close()
    return combine_exit_codes(codes)
