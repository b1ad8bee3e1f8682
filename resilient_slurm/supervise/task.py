"""What each task of a Slurm job runs: rank setup from Slurm, the training job, then the decision.

Submitted through submitit (the `SlurmTask` callable) or started by `sbatch/train.sbatch` with
`python -m resilient_slurm.supervise.task RUN_DIR`. Each requeue re-runs it; it resumes from the run
directory's newest valid checkpoint.

In a step run by the job's driver (`supervise/driver.py`, whose `RankLaunch` says `driven`), the task only
records: the driver reads the ledger when the step ends and decides for the whole allocation. A
task then exits 0 after any orderly end every rank agreed on (finished, stopped, gave up), so that
srun's `--kill-on-bad-exit` cuts no rank short while it closes, and non-zero after a failure, so
that it does.

submitit's own signal handling is replaced, not wrapped: it checkpoints from inside the USR2
handler, on rank 0 only, and ignores SIGTERM. A distributed run must save at a step boundary,
on every rank at the same step, and must save on SIGTERM too (`scontrol requeue`, preemption
without a user signal). So our handlers go in first and only record the request; submitit's
timeout countdown is unused (max_num_timeout=0) and our restart budget, kept in the run's
ledger, decides about requeues.

A rank the kernel's OOM killer takes leaves no trace of its own: a surviving task on its host finds
the kernel-log line naming its pid (every rank's pid is in the attempt's `start` event), or its
memory cgroup's oom_kill counter risen, and records `host_oom` before the decision, so the node is
not blamed. A survivor on another host cannot see that log; if it decides first, this decision
misses the host OOM (the next one still reads it).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from resilient_slurm.rundir import RunDir
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.process.signals import install_stop_handlers
from resilient_slurm.process.threads import yield_when_idle

if TYPE_CHECKING:
    from resilient_slurm.process.launch import RankLaunch
    from resilient_slurm.session.rejoin import Instruction
    from resilient_slurm.process.signals import StopRequest
    from resilient_slurm.slurm.env import SlurmEnv
    from resilient_slurm.health.oom_watch import OomWatch
    from resilient_slurm.ledger import EventLog
    from resilient_slurm.recovery import Decision


JOIN_TIMEOUT_S = 60.0
"""How long a replacement rank waits for the driver to write where its generation meets."""


class GaveUp(RuntimeError):
    """The job stops for good: requeueing again would not help."""


class SlurmTask:
    """Picklable and small: everything else is read from the run directory at run time."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def __call__(self) -> str:
        # First, before the slow imports: a preemption notice may come at any moment.
        stop = install_stop_handlers()
        yield_when_idle(os.environ)  # before torch is imported below
        from resilient_slurm import recovery
        from resilient_slurm.health.oom_watch import OomWatch, memory_cgroup_dirs
        from resilient_slurm.rundir.identity import load_config
        from resilient_slurm.ledger import Attempt, EventLog, read_events
        from resilient_slurm.ledger import GaveUp as GaveUpEvent
        from resilient_slurm.runtime.rank import run as run_rank
        from resilient_slurm.session.distributed import RankInfo
        from resilient_slurm.slurm.env import SlurmEnv, master_port
        from resilient_slurm.supervise.health_watch import NodeHealthWatch
        from resilient_slurm.slurm.scontrol import node_address
        from resilient_slurm.process.launch import RankLaunch, mark_generation
        from resilient_slurm.session.replica_place import place_from_launch

        run_dir = Path(self.run_dir)
        launch = RankLaunch.from_env(os.environ)
        driven = launch.driven
        env = SlurmEnv.from_env()
        if env is None:
            raise RuntimeError("not inside a Slurm task (no SLURM_JOB_ID/SLURM_PROCID); use cluster=local")
        if launch.host_job:  # in a job that lends the run its nodes: a task of the run's own job
            env = replace(env, job_id=launch.host_job, restart_count=launch.host_restart)
        cfg = load_config(run_dir)
        joining = _joining(run_dir, env, stop, launch)
        if joining is not None and joining.replica_group is not None:
            # A replica group's replacement: it heals from a live group, and beats in the one
            # generation all groups share (the driver restarts ranks in the monitor, not generations).
            launch = replace(launch, replica_group=joining.replica_group, replica_heal=True)
            mark_generation(os.environ, 0)
        if joining is None:
            rank = env.procid
        else:
            first = launch.join_rank if launch.join_rank is not None else joining.replaced[env.step_id]
            rank = first + env.procid
        # Every rank of a generation writes under its attempt key, whichever step it runs in.
        context = env.context() if joining is None else {**env.context(), "job_step": joining.job_step}
        events = EventLog(RunDir(run_dir).events, rank=rank, context=context)
        # A generation's attempt is the driver's to record; with replica groups, group 0's start's.
        if env.procid == 0 and joining is None and not launch.replica_group:
            history = read_events(RunDir(run_dir).events)
            cause = recovery.restart_cause(history, env.attempt)
            events.emit(Attempt(nodes=list(env.nodes), ntasks=env.ntasks, cause=cause), None)
        if joining is None:
            info = RankInfo(env.procid, env.ntasks, env.localid, node_address(env.nodes[0]),
                            master_port(env.job_id, env.step_id), env.nodename, env.local_ntasks)
        else:  # a replacement rank: the generation's world, as the driver's word has it
            info = RankInfo(rank, joining.world_size, rank % joining.tasks_per_node, joining.master_addr,
                            joining.master_port, env.nodename, env.local_ntasks)
        if cfg.cluster.replica_ft:  # this step's ranks are one replica group: its process group
            info = replace(info, replica=place_from_launch(launch, cfg.parallel.dp_replicate, info.world_size))
        kernel_log = cfg.health.kernel_log.replace("%n", env.nodename) if cfg.health.kernel_log else None
        oom_watch = OomWatch(memory_cgroup_dirs(), kernel_log)  # only kills from now on count

        def conclude(code: int, step: int | None, signal: str | None, error: str | None) -> recovery.Decision:
            """Decide from the ledger and act: one task requeues (a second `scontrol requeue` would
            restart the job twice) and records why."""
            if code == ExitCode.FAILED:
                _record_host_oom(run_dir, env.attempt, oom_watch, step, events)
            history = read_events(RunDir(run_dir).events)
            decision = recovery.decide(code, signal, error, history, cfg.cluster.max_restarts)
            acts = decision.action in (recovery.Action.REQUEUE, recovery.Action.GIVE_UP)
            if acts and not driven and _claim(run_dir, env.attempt):
                if decision.action is recovery.Action.GIVE_UP:
                    events.emit(GaveUpEvent(reason=decision.reason), step)
                else:
                    requeue(env.job_id, decision, step, cfg.cluster.exclude_file, cfg.health.exclude_ttl_h * 3600.0,
                            events)
            return decision

        def on_hang(step: int, reason: str) -> None:
            if not driven:
                conclude(ExitCode.FAILED, step, None, f"hang: {reason}")

        # One health checker per node; before training, a failing node is refused outright.
        watch = NodeHealthWatch(cfg, run_dir, env.nodename, env.job_id, events) if env.localid == 0 else None
        if watch and cfg.health.preflight:
            refused = watch.check()
            if refused:
                if not driven:
                    conclude(ExitCode.RESUME, None, None, refused)
                # Non-zero in a driven step too: its other tasks wait in the rendezvous for this one.
                sys.exit(int(ExitCode.RESUME))
        if watch:
            watch.start(stop)
        try:
            outcome = run_rank(cfg, run_dir, info, context=context, stop=stop, on_hang=on_hang)
        finally:
            if watch:
                watch.stop()
        if driven:
            orderly = outcome.code in (ExitCode.DONE, ExitCode.RESUME, ExitCode.GAVE_UP)
            sys.exit(0 if orderly else int(outcome.code))
        decision = conclude(outcome.code, outcome.step, outcome.signal, outcome.error)
        if decision.action is recovery.Action.FINISH:
            return f"finished at step {outcome.step}"
        if decision.action is recovery.Action.GIVE_UP:
            print(f"resilient_slurm: giving up: {decision.reason}", file=sys.stderr, flush=True)
            raise GaveUp(decision.reason)
        # Exit without a result: the job is requeued (or Slurm is ending it), so the run is not done.
        sys.exit(int(outcome.code))


def requeue(job_id: str, decision: Decision, step: int | None, exclude_file: str | None, exclude_ttl_s: float,
            events: EventLog) -> None:
    """Requeue the job, without `decision.exclude_nodes` (also put on the exclude list), and record it."""
    from resilient_slurm.health import exclude_list
    from resilient_slurm.ledger import Requeue
    from resilient_slurm.slurm import scontrol

    ok, message = scontrol.requeue(job_id)
    error = None if ok else message.strip()
    excluded: list[str] | None = None
    set_ok: bool | None = None
    set_error: str | None = None
    if decision.exclude_nodes:
        excluded = list(decision.exclude_nodes)
        if exclude_file:
            for node in decision.exclude_nodes:
                exclude_list.add(exclude_file, node, reason=decision.reason, now=time.time(), job_id=job_id,
                                 ttl_s=exclude_ttl_s)
            excluded = exclude_list.exclude_value(exclude_list.load(exclude_file), time.time()).split(",")
        # Only a pending job takes ExcNodeList, which is what it is right after the requeue.
        excluded = sorted(set(excluded))
        set_ok, set_message = scontrol.set_excluded_nodes(job_id, excluded)
        set_error = None if set_ok else set_message.strip()
    events.emit(Requeue(reason=decision.reason, ok=ok, error=error, exclude=excluded, exclude_ok=set_ok,
                        exclude_error=set_error), step)


def _record_host_oom(run_dir: Path, attempt: tuple[str, int, int], watch: OomWatch, step: int | None,
                     events: EventLog) -> None:
    """Record the rank of this attempt that the OOM killer took, if this task can tell (one task)."""
    from resilient_slurm.health.oom_kill import judge_failed_attempt
    from resilient_slurm.ledger import HostOom, Start, read_events
    from resilient_slurm.recovery import attempt_key

    starts = [e.details for e in read_events(RunDir(run_dir).events)
              if isinstance(e.details, Start) and attempt_key(e) == attempt]
    pids, hosts = (starts[-1].pids or [], starts[-1].hosts or []) if starts else ([], [])
    here = os.uname().nodename  # the kernel whose log this task reads
    mine = {rank: pid for rank, (pid, host) in enumerate(zip(pids, hosts)) if host == here and pid != os.getpid()}
    found = judge_failed_attempt(mine, watch.kills(), watch.before, watch.counters())
    if found and _claim(run_dir, attempt, "host_oom"):
        rank, verdict = found
        events.emit(HostOom(killed_rank=rank, pid=verdict.pid, source=verdict.source, evidence=verdict.evidence), step)


def _joining(run_dir: Path, env: SlurmEnv, stop: StopRequest, launch: RankLaunch) -> Instruction | None:
    """A replacement step's tasks join the generation the driver started them for: its word says
    where (it is written once srun has named the step, so they wait for it). A standby's task first
    waits, ready, to be woken into a generation; it exits 0 when the job stops or ends meanwhile."""
    from resilient_slurm.process.launch import mark_generation
    from resilient_slurm.session import rejoin

    generation = launch.join
    if launch.standby:
        import resilient_slurm.trainer.trainer  # noqa: F401 - imported before the wake, not after it

        woken = rejoin.await_wake(rejoin.wake_path(run_dir, env.job_id, env.restart_count, env.step_id),
                                  lambda: stop.requested)
        if woken is None:
            sys.exit(0)  # it trained nothing: nothing to save, nothing to record
        generation = woken
    if not generation:
        return None
    mark_generation(os.environ, generation)  # this process's heartbeats carry it
    path = rejoin.instruction_path(run_dir, env.job_id, env.restart_count, generation)
    word = rejoin.await_instruction(path, JOIN_TIMEOUT_S)
    if word is None:
        raise RuntimeError(f"no word from the driver at {path} within {JOIN_TIMEOUT_S:.0f} s")
    return word


def _claim(run_dir: Path, attempt: tuple[str, int, int], what: str = "") -> bool:
    """True for the one task of this start that acts on the decision (or records `what`)."""
    marks = RunDir(run_dir).slurm / "decisions"
    marks.mkdir(parents=True, exist_ok=True)
    name = ".".join(map(str, attempt)) + (f".{what}" if what else "")
    try:
        os.close(os.open(marks / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.supervise.task RUN_DIR` (inside srun)."""
    if len(argv) != 1:
        print("usage: python -m resilient_slurm.supervise.task RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        print(SlurmTask(argv[0])())
    except GaveUp:
        return ExitCode.GAVE_UP
    return ExitCode.DONE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
