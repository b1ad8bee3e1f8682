"""The job's driver: runs training as job steps on part of the allocation and, after a failure,
starts it again inside the allocation (on a spare node, in place, or on fewer nodes).

It runs in the job's batch script: `launch/submit.py` submits `SlurmDriver` through submitit with
`use_srun=False` when `cluster.spare_nodes` or `cluster.elastic.min_nodes` is set. The job holds
cluster.nodes + spare_nodes nodes; each start of training is one `srun` step with an explicit
node list (`srun.step_argv`), whose tasks only record (`task.py`). When a step ends the driver
reads what they recorded (`step_end.judge`), decides with the code every restart uses
(`recovery.decide`: restart budget, crash-loop guard, node classification) and places the next
step (`placement.after_failure`: spares first, then fewer nodes down to elastic.min_nodes). Below
that, and for a stop the scheduler asked for (time limit, preemption), the job is requeued as
before, without the nodes that failed in this allocation; a SIGTERM (scancel, scontrol requeue)
lets the step save and ends the driver without a decision, as Slurm is ending the job.

A failed step is killed at once, every task of it (`scancel --signal=KILL JOB.STEP`), so no rank
stays behind in a collective or holding a GPU; the next step meets on a new port
(`env.master_port`). The restart is recorded once the new start has taken its first step:
`restart_in_allocation`, with the time from the failure to the first process and to that step.

A node that failed is not chosen again unless it is returned to service: drained (or put on the
exclude list) when it failed, then resumed in Slurm and off the exclude list, by a person or by
its own health check (`placement.seen`). While a shrunk run is short of its nodes, the driver
looks at its failed nodes at every checkpoint the step commits; when some are back and growing
pays (`placement.grow_back`: the capacity regained until the next expected failure, from the
ledger's failure rate and checkpoint.mtbf_prior_h, beats one restart as this allocation last
measured it), it stops the step with the warning signal that cluster.signal is not (so its stop
is told from the time-limit warning, which requeues); every task saves and exits, and the next
step runs on the larger node set, resharded from that checkpoint as after a shrink.

Limits: the driver lives on the allocation's first node. If that node dies the job ends with it,
and Slurm requeues it (NODE_FAIL) through the queue, as without a driver. A time-limit warning
that reaches a step the driver is already stopping to grow back is not told apart: the tasks
record the first signal only, and the grown step then runs into the time limit unwarned.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilient_slurm.rundir import RunDir
from resilient_slurm.files import stamp_seconds
from resilient_slurm import recovery
from resilient_slurm.checkpoint.interval import failure_history, mtbf_s
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import (
    FAILURES,
    Attempt,
    Crash,
    Event,
    EventLog,
    NodeUnhealthy,
    RestartInAllocation,
    Save,
    read_events,
    read_new_events,
    select,
)
from resilient_slurm.ledger import GaveUp as GaveUpEvent
from resilient_slurm.monitor.heartbeats import culprits
from resilient_slurm.session import rejoin
from resilient_slurm.session.heartbeat import HEARTBEAT_ENV
from resilient_slurm.process.signals import install_stop_handlers
from resilient_slurm.process.threads import yield_when_idle
from resilient_slurm.slurm import placement, scontrol, srun
from resilient_slurm.slurm.env import expand_hostlist, master_port
from resilient_slurm.slurm.placement import Allocation
from resilient_slurm.slurm.step_end import Untraced, judge
from resilient_slurm.supervise.hangs import record_silence
from resilient_slurm.supervise.heartbeat import HeartbeatMonitor
from resilient_slurm.supervise.restarts import PendingRestart, record_restart
from resilient_slurm.supervise.standby import Standbys
from resilient_slurm.supervise.steps import Generation
from resilient_slurm.supervise.task import GaveUp, requeue

if TYPE_CHECKING:
    from resilient_slurm.config import Config

POLL_S = 0.05
REJOIN_SETTLE_S = 1.0
"""After a rank's death, how long the driver lets its trace and its peers' reach the ledger."""
METRICS_TAIL_BYTES = 4096


class SlurmDriver:
    """Picklable and small, like SlurmTask: everything else is read from the run directory."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def __call__(self) -> str:
        # Before the slow imports: a SIGTERM (scancel, requeue) may come at any moment.
        self.stop = install_stop_handlers()
        yield_when_idle(os.environ)  # the steps' tasks inherit it
        from resilient_slurm.config import min_nodes
        from resilient_slurm.rundir.identity import load_config

        self.path = Path(self.run_dir)
        self.cfg: Config = load_config(self.path)
        e = os.environ
        self.job_id = e["SLURM_JOB_ID"]
        self.restart = int(e.get("SLURM_RESTART_COUNT", "0") or 0)
        self.node = e.get("SLURMD_NODENAME", "")
        alloc = placement.initial(expand_hostlist(e["SLURM_JOB_NODELIST"]), self.cfg.cluster.nodes,
                                  min_nodes(self.cfg.cluster))
        _say(f"training on {','.join(alloc.in_use)}; spares: {','.join(alloc.spares) or 'none'}")
        # The other warning signal than the time limit's, so the tasks' record of the stop tells
        # the driver's own stop (grow back) from the time-limit warning (requeue).
        self.grow_signal = "USR2" if self.cfg.cluster.signal == "USR1" else "USR1"
        m = self.cfg.monitor
        self.monitor = HeartbeatMonitor(scontrol.node_address(self.node), m.heartbeat_timeout_s, m.heartbeat_phase_s) \
            if m.heartbeat_timeout_s > 0 and self.node else None
        if self.monitor is not None:  # the steps' tasks inherit it (srun --export=ALL)
            os.environ[HEARTBEAT_ENV] = self.monitor.address
        # A user's own loop (entry=) cannot rebuild itself in its process: every process restarts.
        self.in_process = self.cfg.cluster.restart_in_process and not self.cfg.entry
        if self.in_process:
            os.environ[rejoin.REJOIN_ENV] = "1"
        pending: PendingRestart | None = None
        self.refused, self.decided_at, self.ended_at, self.hung = "", 0.0, 0.0, False
        self.standbys = Standbys()
        if self.cfg.cluster.replica_ft:
            from resilient_slurm.supervise.replica_driver import ReplicaDriver

            return ReplicaDriver(self).run(alloc)
        while True:
            if self.stop.requested:
                sys.exit(int(ExitCode.RESUME))
            step = self._launch(alloc)
            if pending is not None:
                pending.placed_at = step.launched_at
            alloc = self._watch(step, pending, alloc)
            self.standbys.dismiss(self.job_id)  # their nodes may be the next start's
            outcome = self._conclude(step, alloc)
            if isinstance(outcome, str):
                return outcome
            alloc, pending = outcome

    # --- one step
    def _launch(self, alloc: Allocation) -> Generation:
        c, nodes = self.cfg.cluster, alloc.in_use
        _say(f"starting training on {','.join(nodes)}")
        gen = Generation([])
        gen.start(self._argv(nodes, c.tasks_per_node), nodes)
        self.hung, self.refused = False, ""
        if self.monitor is not None:
            self.monitor.restart(0)
        if self.in_process and c.standby and alloc.spares:
            # After the training step has its id: step ids then follow the starts (0 trains first).
            gen.sruns[0].named.wait(REJOIN_SETTLE_S * 30)
            self.standbys.start(lambda node: self._argv((node,), 1, (f"{rejoin.STANDBY_ENV}=1",)), alloc.spares,
                                c.tasks_per_node)
            _say(f"a process stands by on {','.join(alloc.spares)}")
        return gen

    def _argv(self, nodes: tuple[str, ...], tasks_per_node: int, env: tuple[str, ...] = ()) -> list[str]:
        c = self.cfg.cluster
        return srun.step_argv(nodes, tasks_per_node,
                              [sys.executable, "-u", "-m", "resilient_slurm.supervise.task", str(self.path)],
                              cpus_per_task=c.cpus_per_task, gpus_per_node=c.gpus_per_node, extra=c.srun_extra,
                              survivors_stay=self.in_process, env=env)

    def _watch(self, gen: Generation, restart: PendingRestart | None, alloc: Allocation) -> Allocation:
        """Until every srun of the start exits: a bad report restarts the survivors in their processes
        (`_in_process`) or ends the start; a rank the heartbeats find silent ends it as a hang. The
        restart that began it (or a restart inside the processes) is recorded once its first step is
        written (or, without one, when it ends). A run short of its nodes looks at its failed nodes
        at each checkpoint the step commits, and stops the step to grow back when nodes were
        returned to service and growing pays. Returns the allocation as last seen."""
        killed = False
        ledger_at = _size(RunDir(self.path).events)
        if alloc.failed:  # which failed nodes are out of service now, so their return is seen later
            alloc = placement.seen(alloc, self._usable(alloc.failed))
        while gen.running():
            time.sleep(POLL_S)
            if gen.grow is None and gen.step_id is not None and len(alloc.in_use) < alloc.target and (
                    alloc.failed or alloc.spares):
                news, ledger_at = read_new_events(RunDir(self.path).events, ledger_at)
                if any(self._committed(e, gen.step_id) for e in news):
                    alloc = self._grow_if_it_pays(gen, alloc)
            if restart is not None:
                first_step_at = _first_step_since(RunDir(self.path).metrics, restart.placed_at or gen.launched_at)
                if first_step_at is not None:
                    record_restart(self.path, restart, self._log(gen.step_id), gen.step_id, first_step_at)
                    restart = None
            if killed:
                continue
            if self.monitor is not None and (silent := self.monitor.silent(range(len(alloc.in_use) *
                                                                              self.cfg.cluster.tasks_per_node))):
                for s in culprits(silent):
                    node = alloc.in_use[s.rank // self.cfg.cluster.tasks_per_node]
                    record_silence(self.path, s, None, self._context(gen.step_id, node))
                self.hung, self.decided_at = True, time.time()
                if self.in_process:
                    self.refused = recovery.inprocess_refusal(True, (), 0, True) or ""
                killed = self._kill(gen)
            elif gen.reports:
                if gen.origin is None:
                    gen.origin = len(gen.reports)
                self.decided_at = time.time()
                moved = self._in_process(gen, alloc) if self.in_process else None
                if moved is None:
                    killed = self._kill(gen)
                else:
                    alloc, restart = moved
        if restart is not None:
            record_restart(self.path, restart, self._log(gen.step_id), gen.step_id,
                           _first_step_since(RunDir(self.path).metrics, restart.placed_at or gen.launched_at))
        self.ended_at = time.time()
        return alloc

    def _kill(self, gen: Generation) -> bool:
        """Every task of the start, at once: no rank stays behind in a collective or holding a GPU."""
        for s in gen.sruns:
            if s.proc.poll() is None:
                ok, message = scontrol.kill_step(self.job_id, s.step_id)
                if not ok:
                    _say(f"could not kill step {s.step_id}: {message}")
        return True

    def _committed(self, e: Event[Any], step_id: int) -> bool:
        """A checkpoint this step committed on its own schedule (not the one it stops or ends with)."""
        return isinstance(e.details, Save) and e.details.reason not in ("emergency", "final") \
            and recovery.attempt_key(e) == (self.job_id, self.restart, step_id)

    def _grow_if_it_pays(self, step: Generation, alloc: Allocation) -> Allocation:
        """At a checkpoint: take back the failed nodes returned to service, and stop the step (it
        saves, then exits) when growing onto them pays for the restart this allocation measured."""
        alloc = placement.seen(alloc, self._usable(alloc.failed))
        if not alloc.spares:
            return alloc
        history = read_events(RunDir(self.path).events)
        restart_s = restart_cost_s(history, self.job_id, self.restart)
        mtbf = mtbf_s(failure_history(history, time.time()), self.cfg.checkpoint.mtbf_prior_h * 3600.0)
        grow = None if restart_s is None else placement.grow_back(alloc, restart_s, mtbf)
        if grow is None:
            return alloc
        # To srun, which passes it on to every task of its step. Not `scancel --signal` on the
        # step: Slurm 22.05's fails (while delivering it) for a step on part of the allocation.
        for s in step.sruns:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.Signals[f"SIG{self.grow_signal}"])
        step.grow, step.grow_asked_at = grow, time.time()
        _say(f"stopping step {step.step_id} ({self.grow_signal}) to {grow.reason}")
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
            _say(f"cannot tell whether failed nodes are back in service: {error}")
            return {}
        return {n: scontrol.in_service(state) and n not in listed for n, state in states.items() if n in nodes}

    def _conclude(self, step: Generation, alloc: Allocation) -> str | tuple[Allocation, PendingRestart]:
        """Decide after a step ended: the result when training finished, else the next allocation
        and the restart to record (or the job is requeued, or it ends, and this does not return)."""
        ended_at = time.time()
        history = read_events(RunDir(self.path).events)
        if step.step_id is None:  # srun did not say (another version's -v): its tasks' events do
            step.step_id = next((e.job_step for e in history if (e.job_id, e.restart) == (self.job_id, self.restart)
                                 and e.rank >= 0 and stamp_seconds(e.time) >= step.launched_at), None)
        key = (self.job_id, self.restart, step.step_id)
        ours = [e for e in history if step.step_id is not None and recovery.attempt_key(e) == key]
        origin = step.origin_reports
        c, ttl_s = self.cfg.cluster, self.cfg.health.exclude_ttl_h * 3600.0
        if step.step_id is None and not self.stop.requested:
            # srun retries a step the nodes cannot take yet itself; one it gave up on means the
            # allocation cannot run it: only a new one can.
            reason = f"srun could not start a step on {','.join(step.nodes)} (exit {step.proc.returncode})"
            _say(f"requeueing: {reason}")
            requeue(self.job_id, recovery.Decision(recovery.Action.REQUEUE, reason), None, c.exclude_file, ttl_s,
                    self._log(None))
            sys.exit(int(ExitCode.RESUME))
        end = judge(ours, origin)
        last_step = max([e.step for e in ours if isinstance(e.step, int)], default=None)
        for task in end.untraced:
            self._log(step.step_id, _rank_of(task, alloc.in_use, self.cfg.cluster.tasks_per_node), task.node).emit(
                Crash(error=task.error, traceback=""), last_step)
        grown = step.grow
        if grown is not None and end.code == ExitCode.RESUME and end.signal == f"SIG{self.grow_signal}" \
                and not end.unhealthy and not self.stop.requested:
            _say(f"restarting inside the allocation (grow): {grown.reason}")
            return grown.allocation, PendingRestart(f"{', '.join(grown.added)} back in service", grown.reason, "grow", [],
                                              list(grown.added), step.grow_asked_at, last_step,
                                              nodes=grown.allocation.in_use)
        if end.code == ExitCode.FAILED and not end.untraced and not any(e.kind in FAILURES for e in ours):
            self._log(step.step_id).emit(Crash(error=end.error or "", traceback=""), last_step)
        events = self._log(step.step_id)
        history = read_events(RunDir(self.path).events)  # with the failures just recorded
        decision = recovery.decide(end.code, end.signal, end.error, history, self.cfg.cluster.max_restarts)
        _say(f"step {step.step_id} ended ({end.code.name}): {decision.action}: {decision.reason}")
        if decision.action is recovery.Action.FINISH:
            return f"finished at step {last_step}"
        if decision.action is recovery.Action.GIVE_UP:
            events.emit(GaveUpEvent(reason=decision.reason), last_step)
            print(f"resilient_slurm: giving up: {decision.reason}", file=sys.stderr, flush=True)
            raise GaveUp(decision.reason)
        if self.stop.requested or decision.action is recovery.Action.EXIT:
            # Slurm is ending the job (scancel, scontrol requeue, preemption): it decides what next.
            sys.exit(int(ExitCode.RESUME))
        if end.code == ExitCode.RESUME and end.signal in recovery.WARNING_SIGNALS:
            # The allocation itself is ending (time limit, preemption notice): only the queue helps.
            requeue(self.job_id, decision, last_step, c.exclude_file, ttl_s, events)
            sys.exit(int(ExitCode.RESUME))
        held = set(alloc.in_use) | set(alloc.spares)
        failed = [n for n in dict.fromkeys([*end.unhealthy, *(x.node for x in end.lost), *step.lost,
                                             *decision.exclude_nodes]) if n in held]
        self._take_out([n for n in decision.exclude_nodes if n in held and n not in end.unhealthy], decision.reason)
        placed = placement.after_failure(alloc, failed)
        if placed.move is placement.Move.REQUEUE:
            why = recovery.Decision(recovery.Action.REQUEUE, f"{decision.reason}; {placed.reason}",
                                    exclude_nodes=tuple(sorted(set(placed.exclude) | set(decision.exclude_nodes))))
            _say(f"requeueing: {why.reason}")
            requeue(self.job_id, why, last_step, c.exclude_file, ttl_s, events)
            sys.exit(int(ExitCode.RESUME))
        traces = [stamp_seconds(e.time) for e in ours if e.kind in FAILURES or isinstance(e.details, NodeUnhealthy)]
        failed_at = min([ended_at, *step.report_times[: len(origin)], *traces])
        move = "shrink" if placed.move is placement.Move.SHRINK else "spare" if placed.added else "in place"
        _say(f"restarting inside the allocation ({move}): {placed.reason}")
        return placed.allocation, PendingRestart(decision.reason, placed.reason, move, failed, list(placed.added), failed_at,
                                           last_step, "step", self.refused, self.decided_at or ended_at,
                                           ended_at=self.ended_at, nodes=placed.allocation.in_use)

    def _take_out(self, nodes: list[str], reason: str) -> None:
        """Nodes the failures follow (the crash-loop guard): on the exclude list, and drained where
        allowed. A node that failed its health check was taken out by the check itself."""
        for node in nodes:
            if self.cfg.cluster.exclude_file:
                exclude_list.add(self.cfg.cluster.exclude_file, node, reason=reason, now=time.time(),
                                 job_id=self.job_id, ttl_s=self.cfg.health.exclude_ttl_h * 3600.0)
            if self.cfg.health.drain:
                ok, message = scontrol.drain_node(node, f"resilient_slurm: {reason}")
                if not ok:
                    _say(f"could not drain {node}: {message}")

    def _log(self, step_id: int | None, rank: int = -1, node: str | None = None) -> EventLog:
        """The driver writes under the step's attempt key; a lost task's failure under its own rank and node."""
        return EventLog(RunDir(self.path).events, rank=rank, context=self._context(step_id, node))

    def _context(self, step_id: int | None, node: str | None = None) -> dict[str, Any]:
        return {"job_id": self.job_id, "restart": self.restart, "job_step": step_id or 0, "node": node or self.node}

    # --- a restart inside the surviving processes
    def _in_process(self, gen: Generation, alloc: Allocation) -> tuple[Allocation, PendingRestart] | None:
        """After a rank's process died: its replacement started (on a spare when its node is lost, else
        in place), the survivors told where the next generation meets; or None, with the reason in
        `self.refused`, when they cannot go on (a CUDA-class error, no survivor, another world size, a
        decision that is not a restart), and the start is ended instead."""
        c = self.cfg.cluster
        time.sleep(REJOIN_SETTLE_S)  # the failed ranks' own traces and the survivors' peer_lost reach the ledger
        key = (self.job_id, self.restart, gen.step_id)
        ours = [e for e in read_events(RunDir(self.path).events) if recovery.attempt_key(e) == key]
        origin = gen.origin_reports
        end = judge(ours, origin)
        last_step = max([e.step for e in ours if isinstance(e.step, int)], default=None)
        for task in end.untraced:
            self._log(gen.step_id, _rank_of(task, alloc.in_use, c.tasks_per_node), task.node).emit(
                Crash(error=task.error, traceback=""), last_step)
        # Recorded now, these tasks have a trace: the step's end, if it comes to that, must still
        # count their nodes as lost.
        gen.lost.extend(x.node for x in end.lost)
        world = len(alloc.in_use) * c.tasks_per_node
        lost_nodes = {x.node for x in end.lost if x.rank is None}
        failed = sorted({_rank_of(x, alloc.in_use, c.tasks_per_node) for x in end.untraced if x.rank is not None}
                        | {e.rank for e in ours if e.kind in FAILURES and e.rank >= 0}
                        | {r for r in range(world) if alloc.in_use[r // c.tasks_per_node] in lost_nodes})
        gone = [*end.unhealthy, *(x.node for x in end.lost)]
        placed = placement.after_failure(alloc, gone)
        errors = [e.details.error for e in ours if isinstance(e.details, Crash) and e.rank in failed]
        same_size = placed.move is placement.Move.RESTART and len(placed.allocation.in_use) == len(alloc.in_use)
        self.refused = recovery.inprocess_refusal(False, errors, world - len(failed), same_size) or ""
        decision = recovery.decide(end.code, end.signal, end.error, read_events(RunDir(self.path).events),
                                   c.max_restarts)
        if not self.refused and decision.action is not recovery.Action.REQUEUE:
            self.refused = f"the decision is {decision.action.value}: {decision.reason}"
        if self.refused:
            _say(f"every process restarts: {self.refused}")
            return None
        new = placement.keep_positions(alloc.in_use, placed.allocation, gone)
        replaced: dict[int, int] = {}
        for rank in failed:
            node = new.in_use[rank // c.tasks_per_node]
            s = self.standbys.take(node)
            if s is not None and s.step_id is not None:  # take() hands out named ones only
                gen.adopt(s)
                rejoin.wake(self.path, self.job_id, self.restart, s.step_id, gen.number + 1)
            else:
                s = gen.start(self._argv((node,), 1, (f"{rejoin.JOIN_ENV}={gen.number + 1}",)), (node,))
            if not s.named.wait(REJOIN_SETTLE_S * 30) or s.step_id is None:
                self.refused = f"srun did not start the replacement of rank {rank} on {node}"
                return None
            replaced[s.step_id] = rank
        failed_at = min([*gen.report_times[: len(origin)], self.decided_at])
        step_id = min(replaced)
        master = scontrol.node_address(new.in_use[0])
        rejoin.write_instruction(self.path, self.job_id, self.restart, rejoin.Instruction(
            gen.number + 1, step_id, master, master_port(self.job_id, step_id), world, replaced, c.tasks_per_node,
            self.decided_at))
        placed_at = time.time()
        history = read_events(RunDir(self.path).events)
        self._log(step_id).emit(Attempt(nodes=list(new.in_use), ntasks=world, cause=recovery.restart_cause(
            history, (self.job_id, self.restart, step_id))), None)
        if self.monitor is not None:
            self.monitor.restart(gen.number + 1)
        gen.next(step_id)
        move = "spare" if placed.added else "in place"
        _say(f"restarting inside the surviving processes ({move}): ranks {failed} start anew; {placed.reason}")
        return new, PendingRestart(decision.reason, placed.reason, move, list(dict.fromkeys(gone)), list(placed.added),
                             failed_at, last_step, "inprocess", "", self.decided_at, placed_at,
                             replacements=tuple(failed), nodes=new.in_use)


def _rank_of(task: Untraced, nodes: tuple[str, ...], tasks_per_node: int) -> int:
    """The global rank of a task srun reported: its position on its node in the start's node list
    (a replacement step's tasks count from 0 on their node, as the first step's do); -1 for none."""
    if task.rank is None:
        return -1
    if task.node in nodes:
        return nodes.index(task.node) * tasks_per_node + task.rank % tasks_per_node
    return int(task.rank)


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




def _say(message: str) -> None:
    print(f"resilient_slurm driver: {message}", file=sys.stderr, flush=True)


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
