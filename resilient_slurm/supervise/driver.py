"""The job's driver: runs training as job steps on part of the allocation and, after a failure,
starts it again inside the allocation (on a spare node, in place, or on fewer nodes).

It runs in the job's batch script: `launch/submit.py` submits `SlurmDriver` through submitit with
`use_srun=False` when `cluster.spare_nodes` or `cluster.elastic.min_nodes` is set. The job holds
cluster.nodes + spare_nodes nodes; each start of training is one `srun` step with an explicit
node list (`srun.step_argv`), whose tasks only record (`task.py`). When a step ends the driver
reads what they recorded (`step_end.judge`) and concludes (`conclusion.conclude`: finished, restart
here, requeue, leave it to Slurm, give up) with the code every restart uses (`recovery.decide`:
restart budget, crash-loop guard, node classification) and the placement of the next step
(`placement.after_failure`: spares first, then fewer nodes down to elastic.min_nodes); `act` is the
one place that acts on it. Below that, and for a stop the scheduler asked for (time limit,
preemption), the job is requeued as before, without the nodes that failed in this allocation; a
SIGTERM (scancel, scontrol requeue) lets the step save and ends the driver without a decision, as
Slurm is ending the job.

A failed step is killed at once, every task of it (`scancel --signal=KILL JOB.STEP`), so no rank
stays behind in a collective or holding a GPU; the next step meets on a new port
(`env.master_port`). The restart is recorded once the new start has taken its first step:
`restart_in_allocation`, with the time from the failure to the first process and to that step.

The driver runs the heartbeat monitor: a rank found hung is recorded with whom the others wait for
(`hangs.py`) and the step ends as a hang; a rank found slow (`monitor.straggler`) is recorded
(`stragglers.py`) and, with a spare, its node is swapped out at the next checkpoint the step commits.

A node that failed is not chosen again unless it is returned to service: drained (or put on the
exclude list) when it failed, then resumed in Slurm and off the exclude list, by a person or by
its own health check (`placement.seen`). While a shrunk run is short of its nodes, the driver
looks at its failed nodes at every checkpoint the step commits; when some are back and growing
pays (`placement.grow_back`: the capacity regained until the next expected failure, from the
ledger's failure rate and checkpoint.mtbf_prior_h, beats one restart as this allocation last
measured it), it stops the step with the warning signal that cluster.signal is not (so its stop
is told from the time-limit warning, which requeues); every task saves and exits, and the next
step runs on the larger node set, resharded from that checkpoint as after a shrink. A straggler's
swap stops the step the same way.

Limits: the driver lives on the allocation's first node. If that node dies the job ends with it,
and Slurm requeues it (NODE_FAIL) through the queue, as without a driver. A time-limit warning
that reaches a step the driver is already stopping for its own move is not told apart: the tasks
record the first signal only, and the next step then runs into the time limit unwarned.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from resilient_slurm import recovery
from resilient_slurm.checkpoint.interval import failure_history, mtbf_s
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import FAILURES, Crash, Event, RestartInAllocation, Save, read_events, read_new_events, select
from resilient_slurm.ledger import GaveUp as GaveUpEvent
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.process.signals import StopRequest, install_stop_handlers
from resilient_slurm.process.threads import yield_when_idle
from resilient_slurm.rundir import RunDir
from resilient_slurm.slurm import placement, scontrol
from resilient_slurm.slurm.env import expand_hostlist
from resilient_slurm.slurm.placement import Allocation
from resilient_slurm.slurm.step_end import judge
from resilient_slurm.supervise import conclusion as c
from resilient_slurm.supervise.hangs import record_hang
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor
from resilient_slurm.supervise.inprocess import record_untraced, restart_in_processes
from resilient_slurm.supervise.job import DriverJob, say
from resilient_slurm.supervise.restarts import record_restart
from resilient_slurm.supervise.standby import Standbys
from resilient_slurm.supervise.steps import Generation
from resilient_slurm.supervise.stragglers import record_straggler
from resilient_slurm.supervise.task import GaveUp, requeue

POLL_S = 0.05
METRICS_TAIL_BYTES = 4096


class SlurmDriver:
    """Picklable and small, like SlurmTask: everything else is read from the run directory."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def __call__(self) -> str:
        # Before the slow imports: a SIGTERM (scancel, requeue) may come at any moment.
        stop = install_stop_handlers()
        yield_when_idle(os.environ)  # the steps' tasks inherit it
        from resilient_slurm.config import min_nodes
        from resilient_slurm.rundir.identity import load_config

        path = Path(self.run_dir)
        cfg = load_config(path)
        e = os.environ
        node = e.get("SLURMD_NODENAME", "")
        m = cfg.monitor
        monitor = HeartbeatMonitor(scontrol.node_address(node), m) if m.heartbeat_timeout_s > 0 and node else None
        # A user's own loop (entry=) cannot rebuild itself in its process: every process restarts.
        in_process = cfg.cluster.restart_in_process and not cfg.entry
        launch = RankLaunch(run_dir=str(path), heartbeat=monitor.address if monitor else "", driven=True,
                            rejoin=in_process)
        job = DriverJob(path, cfg, e["SLURM_JOB_ID"], int(e.get("SLURM_RESTART_COUNT", "0") or 0), node, launch)
        alloc = placement.initial(expand_hostlist(e["SLURM_JOB_NODELIST"]), cfg.cluster.nodes, min_nodes(cfg.cluster))
        say(f"training on {','.join(alloc.in_use)}; spares: {','.join(alloc.spares) or 'none'}")
        return Driver(job, stop, monitor).run(alloc)


class Driver:
    def __init__(self, job: DriverJob, stop: StopRequest, monitor: HeartbeatMonitor | None) -> None:
        self.job, self.stop, self.monitor = job, stop, monitor
        self.cfg = job.cfg
        # The other warning signal than the time limit's, so the tasks' record of the stop tells
        # the driver's own stop (grow back, swap) from the time-limit warning (requeue).
        self.move_signal = "USR2" if self.cfg.cluster.signal == "USR1" else "USR1"
        self.standbys = Standbys()
        self.refused = ""
        """Why the survivors of this start's failure did not restart in their processes."""
        self.decided_at = 0.0
        """When the driver decided to end this start (0: it ended by itself)."""
        self.ended_at = 0.0
        self.swap: tuple[placement.Placement, str, float] | None = None
        """A straggler's node to swap out at the next checkpoint: the placement, why, when found."""

    def run(self, alloc: Allocation) -> str:
        if self.cfg.cluster.replica_ft:
            from resilient_slurm.supervise.replica_driver import ReplicaDriver

            return ReplicaDriver(self.job, self.stop, self.monitor, self.standbys, self.act).run(alloc)

        pending: c.PendingRestart | None = None
        while True:
            if self.stop.requested:
                self.act(c.LeaveToSlurm("stop requested"), None)
            gen = self._launch(alloc)
            if pending is not None:
                pending = replace(pending, placed_at=gen.launched_at)
            alloc = self._watch(gen, pending, alloc)
            self.standbys.dismiss(self.job.job_id)  # their nodes may be the next start's
            outcome = c.conclude(self._ended(gen, alloc))
            step = self.act(outcome, gen.step_id)
            if isinstance(step, str):
                return step
            alloc, pending = step

    def act(self, outcome: c.Conclusion, step_id: int | None) -> str | tuple[Allocation, c.PendingRestart]:
        """The one place the driver acts on its conclusion: every exit of the driver is here."""
        job, cfg = self.job, self.cfg
        events = job.log(step_id)
        ttl_s = cfg.health.exclude_ttl_h * 3600.0
        if isinstance(outcome, c.Finished):
            return outcome.reason
        if isinstance(outcome, c.GiveUp):
            events.emit(GaveUpEvent(reason=outcome.reason), outcome.last_step)
            print(f"resilient_slurm: giving up: {outcome.reason}", file=sys.stderr, flush=True)
            raise GaveUp(outcome.reason)
        if isinstance(outcome, c.LeaveToSlurm):
            say(f"leaving it to Slurm: {outcome.reason}")
            sys.exit(int(ExitCode.RESUME))
        self._take_out(outcome.take_out, outcome.decision.reason if isinstance(outcome, c.Requeue)
                       else outcome.restart.cause)
        if isinstance(outcome, c.Requeue):
            say(f"requeueing: {outcome.decision.reason}")
            requeue(job.job_id, outcome.decision, outcome.last_step, cfg.cluster.exclude_file, ttl_s, events)
            sys.exit(int(ExitCode.RESUME))
        say(f"restarting inside the allocation ({outcome.restart.move}): {outcome.reason}")
        return outcome.allocation, outcome.restart

    # --- one start
    def _launch(self, alloc: Allocation) -> Generation:
        k, nodes = self.cfg.cluster, alloc.in_use
        say(f"starting training on {','.join(nodes)}")
        gen = Generation([])
        gen.start(self.job.argv(nodes, k.tasks_per_node), nodes)
        self.refused, self.decided_at, self.swap = "", 0.0, None
        if self.monitor is not None:
            self.monitor.restart(0, len(nodes) * k.tasks_per_node)
        if self.job.launch.rejoin and k.standby and alloc.spares:
            # After the training step has its id: step ids then follow the starts (0 trains first).
            gen.sruns[0].named.wait(30)
            self.standbys.start(lambda node: self.job.argv((node,), 1, replace(self.job.launch, standby=True)),
                                alloc.spares, k.tasks_per_node)
            say(f"a process stands by on {','.join(alloc.spares)}")
        return gen

    def _watch(self, gen: Generation, restart: c.PendingRestart | None, alloc: Allocation) -> Allocation:
        """Until every srun of the start exits: a bad report restarts the survivors in their processes
        or ends the start; a rank the heartbeats find hung ends it as a hang; a straggler is recorded
        (and its node swapped out at the next checkpoint). The restart that began it (or a restart
        inside the processes) is recorded once its first step is written (or, without one, when it
        ends). At each checkpoint the step commits, a shrunk run looks at its failed nodes and grows
        back when that pays. Returns the allocation as last seen."""
        killed = False
        paths = RunDir(self.job.path)
        ledger_at = _size(paths.events)
        if alloc.failed:  # which failed nodes are out of service now, so their return is seen later
            alloc = placement.seen(alloc, self._usable(alloc.failed))
        while gen.running():
            time.sleep(POLL_S)
            if gen.move is None and gen.step_id is not None and (self.swap or _short(alloc)):
                news, ledger_at = read_new_events(paths.events, ledger_at)
                if any(self._committed(e, gen.step_id) for e in news):
                    alloc = self._move_if_due(gen, alloc)
            if restart is not None:
                first_step_at = _first_step_since(paths.metrics, restart.placed_at or gen.launched_at)
                if first_step_at is not None:
                    record_restart(self.job.path, restart, self.job.log(gen.step_id), gen.step_id, first_step_at)
                    restart = None
            if killed:
                continue
            world = range(len(alloc.in_use) * self.cfg.cluster.tasks_per_node)
            if self.monitor is not None:
                if self._stragglers(gen, alloc):
                    ledger_at = _size(paths.events)  # the swap waits for the next checkpoint, not an earlier one
                if silent := self.monitor.silent(world):
                    self._record_hang(gen, alloc, silent, world)
                    killed = self._kill(gen)
                    continue
            if gen.reports:
                if gen.origin is None:
                    gen.origin = len(gen.reports)
                self.decided_at = time.time()
                moved = restart_in_processes(self.job, gen, alloc, self.standbys, self.monitor, self.decided_at) \
                    if self.job.launch.rejoin else "restart_in_process is off"
                if isinstance(moved, str):
                    if self.job.launch.rejoin:
                        self.refused = moved
                        say(f"every process restarts: {moved}")
                    killed = self._kill(gen)
                else:
                    alloc, restart = moved
        if restart is not None:
            record_restart(self.job.path, restart, self.job.log(gen.step_id), gen.step_id,
                           _first_step_since(paths.metrics, restart.placed_at or gen.launched_at))
        self.ended_at = time.time()
        return alloc

    def _record_hang(self, gen: Generation, alloc: Allocation, silent: list[Any], world: range) -> None:
        assert self.monitor is not None
        per_node = self.cfg.cluster.tasks_per_node
        front = self.monitor.wavefront(world)
        hung = culprits(silent, front)
        nodes = {r: alloc.in_use[r // per_node] for r in world}
        gone = {s.rank for s in silent if not s.alive}
        record_hang(self.job.path, hung, front, [r for r in world if r not in gone], nodes, {},
                    {r: self.job.context(gen.step_id, nodes[r]) for r in world}, self.cfg.health.node_record,
                    self.job.job_id)
        self.decided_at = time.time()
        if self.job.launch.rejoin:
            key = (self.job.job_id, self.job.restart, gen.step_id)
            errors = [e.details.error for e in read_events(RunDir(self.job.path).events)
                      if isinstance(e.details, Crash) and recovery.attempt_key(e) == key]
            self.refused = recovery.inprocess_refusal(True, errors, 0, True) or ""

    def _stragglers(self, gen: Generation, alloc: Allocation) -> bool:
        """Record each straggler found; plan its node's swap for a spare at the next checkpoint
        (True: a swap was planned now)."""
        assert self.monitor is not None
        planned = False
        for s in self.monitor.stragglers():
            node = alloc.in_use[s.rank // self.cfg.cluster.tasks_per_node]
            swap = placement.swap_out(alloc, node, f"straggler: {s.describe()}") \
                if self.cfg.monitor.straggler.swap and self.swap is None and gen.move is None else None
            record_straggler(self.job.path, s, node, self.job.context(gen.step_id), "swap" if swap else "report",
                             self.cfg.health.node_record, self.job.job_id)
            say(f"straggler on {node}: {s.describe()}" + ("; swapping it for a spare at the next checkpoint"
                                                          if swap else ""))
            if swap is not None:
                self.swap = (swap, f"straggler on {node}: {s.describe()}", time.time())
                planned = True
        return planned

    def _kill(self, gen: Generation) -> bool:
        """Every task of the start, at once: no rank stays behind in a collective or holding a GPU."""
        for s in gen.sruns:
            ok, message = s.kill(self.job.job_id)
            if not ok:
                say(f"could not kill step {s.step_id}: {message}")
        return True

    def _committed(self, e: Event[Any], step_id: int) -> bool:
        """A checkpoint this step committed on its own schedule (not the one it stops or ends with)."""
        return isinstance(e.details, Save) and e.details.reason not in ("emergency", "final") \
            and recovery.attempt_key(e) == (self.job.job_id, self.job.restart, step_id)

    def _move_if_due(self, gen: Generation, alloc: Allocation) -> Allocation:
        """At a checkpoint: the straggler's swap, else a grow back onto failed nodes returned to
        service when it pays for the restart this allocation measured; either stops the step (it
        saves, then exits) with the driver's own signal."""
        if self.swap is not None:
            p, cause, since = self.swap
            self.swap = None
        else:
            alloc = placement.seen(alloc, self._usable(alloc.failed))
            if not alloc.spares:
                return alloc
            history = read_events(RunDir(self.job.path).events)
            restart_s = restart_cost_s(history, self.job.job_id, self.job.restart)
            mtbf = mtbf_s(failure_history(history, time.time()), self.cfg.checkpoint.mtbf_prior_h * 3600.0)
            grow = None if restart_s is None else placement.grow_back(alloc, restart_s, mtbf)
            if grow is None:
                return alloc
            p, cause, since = grow, f"{', '.join(grow.added)} back in service", time.time()
        # To srun, which passes it on to every task of its step. Not `scancel --signal` on the
        # step: Slurm 22.05's fails (while delivering it) for a step on part of the allocation.
        for s in gen.sruns:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.Signals[f"SIG{self.move_signal}"])
        gen.move = c.DriverMove(p, cause, self.move_signal, since, time.time())
        say(f"stopping step {gen.step_id} ({self.move_signal}) to {p.reason}")
        return alloc

    def _usable(self, nodes: frozenset[str]) -> dict[str, bool]:
        """Whether each node takes work now: in service in Slurm and not on the exclude list.
        Empty when either cannot be read: unknown, which neither takes a node out nor brings it back."""
        states, error = scontrol.node_states(sorted(nodes))
        listed: set[str] = set()
        try:
            if self.cfg.cluster.exclude_file:
                entries = exclude_list.load(self.cfg.cluster.exclude_file)
                listed = {e.node for e in exclude_list.active(entries, time.time())}
        except exclude_list.ExcludeListError as e:
            error = str(e)
        if error is not None:
            say(f"cannot tell whether failed nodes are back in service: {error}")
            return {}
        return {n: scontrol.in_service(state) and n not in listed for n, state in states.items() if n in nodes}

    def _ended(self, gen: Generation, alloc: Allocation) -> c.Ended:
        """The facts of a start that ended; the failures no task recorded are recorded here first."""
        job = self.job
        history = read_events(RunDir(job.path).events)
        if gen.step_id is None:  # srun did not say (another version's -v): its tasks' events do
            gen.step_id = next((e.job_step for e in history if (e.job_id, e.restart) == (job.job_id, job.restart)
                                and e.rank >= 0 and stamp_seconds(e.time) >= gen.launched_at), None)
        end, ours, last_step, origin = None, [], None, gen.origin_reports
        if gen.step_id is not None:
            key = (job.job_id, job.restart, gen.step_id)
            ours = [e for e in history if recovery.attempt_key(e) == key]
            end = judge(ours, origin, alloc.in_use, self.cfg.cluster.tasks_per_node)
            last_step = max([e.step for e in ours if isinstance(e.step, int)], default=None)
            record_untraced(job, gen.step_id, end.untraced, alloc.in_use, last_step)
            if end.code == ExitCode.FAILED and not end.untraced and not any(e.kind in FAILURES for e in ours):
                job.log(gen.step_id).emit(Crash(error=end.error or "", traceback=""), last_step)
            history = read_events(RunDir(job.path).events)  # with the failures just recorded
            say(f"step {gen.step_id} ended ({end.code.name})")
        return c.Ended(end=end, ours=tuple(ours), history=tuple(history), allocation=alloc, nodes=gen.nodes,
                       srun_code=gen.proc.returncode, stop_requested=self.stop.requested,
                       max_restarts=self.cfg.cluster.max_restarts, ended_at=time.time(),
                       report_times=tuple(gen.report_times[: len(origin)]), lost_nodes=tuple(gen.lost), move=gen.move,
                       decided_at=self.decided_at, killed_at=self.ended_at, refused=self.refused, last_step=last_step)

    def _take_out(self, nodes: tuple[str, ...], reason: str) -> None:
        """Nodes the failures follow (the crash-loop guard): on the exclude list, and drained where
        allowed. A node that failed its health check was taken out by the check itself."""
        for node in nodes:
            if self.cfg.cluster.exclude_file:
                exclude_list.add(self.cfg.cluster.exclude_file, node, reason=reason, now=time.time(),
                                 job_id=self.job.job_id, ttl_s=self.cfg.health.exclude_ttl_h * 3600.0)
            if self.cfg.health.drain:
                ok, message = scontrol.drain_node(node, f"resilient_slurm: {reason}")
                if not ok:
                    say(f"could not drain {node}: {message}")


def _short(alloc: Allocation) -> bool:
    """Short of its nodes, with failed nodes or spares it might grow back onto."""
    return len(alloc.in_use) < alloc.target and bool(alloc.failed or alloc.spares)


def _first_step_since(metrics: Path, since: float) -> float | None:
    """When the newest metrics row was written, if that was after `since`."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - METRICS_TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            at = stamp_seconds(json.loads(raw)["time"])
        except (ValueError, KeyError, TypeError):
            continue
        return at if at >= since else None
    return None


def restart_cost_s(history: list[Event[Any]], job_id: str, restart: int) -> float | None:
    """What the newest restart inside this allocation took, from the failure (or the driver's stop)
    to the new start's first step: what a grow back costs the nodes in use. None before one did."""
    took = [r.details.latency_s for r in select(history, RestartInAllocation)
            if (r.job_id, r.restart) == (job_id, restart) and r.details.latency_s is not None]
    return took[-1] if took else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.supervise.driver RUN_DIR` (in a batch script, outside srun)."""
    if len(argv) != 1:
        print("usage: python -m resilient_slurm.supervise.driver RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        print(SlurmDriver(argv[0])())
    except GaveUp:
        return ExitCode.GAVE_UP
    return ExitCode.DONE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
