"""Where a run's time went, from its ledger and metrics files. Pure: data in, a summary out.

An **attempt** is one process (or Slurm job run) of the run: it begins with an `attempt` event
(Slurm) or a `start` event, or earlier, when its process started (`process_started` of the
`start` event: imports and model build count too), and ends with its last trace, the later of its
last ledger event and its last metrics row.

- **allocated** = the sum over attempts of (end - begin): the time the run held its resources.
- **productive** = the optimizer-step time (`step_seconds`) of the steps in `metrics.jsonl`: the
  timeline that survived, each step counted once.
- **redone** = the step time of rows in `metrics-lost.jsonl`: steps computed, then lost to a fault
  (killed or crashed after the last checkpoint) and computed again after the resume.
- **saves** = the checkpoint save time of the ledger's `save` events; **evaluation** = the
  `eval_seconds` of every row.
- **restarts and other** = allocated minus all of the above: startup, resume (loading the
  checkpoint), tracking, data and logging between steps, shutdown.
- **waiting** = the gaps between attempts (requeue and queue time): nothing is allocated then, so
  it is shown but is not part of goodput. A gap between two attempts inside one allocation (the
  driver's restart on a spare, in place or on fewer nodes: the same job and requeue count, a new
  job step) is held time, so it counts as allocated, under restarts and other.
- **goodput** = productive / allocated (wall time: the idle spare nodes are not weighed in).

**Restarts** are told apart: inside the allocation, or through the queue (a requeue, or a local
relaunch). Each has its latency from the failure to the new attempt's first process and to its
first step; the failure is when the driver learned of it (`restart_in_allocation`), else the
previous attempt's last trace.

**steps lost** = the sum over restarts of (the last step the previous attempt reached - the step
the next attempt resumed from).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from resilient_slurm.analysis.rank_ends import first_cause, rank_ends
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Crash, Event, GaveUp, Kind, RestartInAllocation, Resume, Save, Signal, Start, select


@dataclass(frozen=True)
class Attempt:
    index: int
    """1-based, in order."""
    begin_s: float
    end_s: float
    resumed_from: int
    last_step: int
    """Highest step this attempt reached (including steps later lost)."""
    outcome: str
    """finished | stopped by SIG... | killed: rank R by <signal or the OOM killer> | crashed: <error> |
    gave up: ... | killed without a trace | running or killed"""
    cause: str | None
    """Why it started: None for the first attempt, else how the one before it ended (the same for
    local runs and Slurm requeues, so causes count alike)."""
    job_id: str | None
    restart: int | None
    job_step: int | None
    in_allocation: bool
    """Started inside the previous attempt's allocation (same job and requeue count, a new step)."""
    first_step_s: float | None
    """When its first step (kept or later lost) was written; None if it took none."""
    productive_s: float
    redone_s: float
    save_s: float
    eval_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.begin_s


BREAKDOWN_PARTS = ("detect", "teardown", "placement", "process_start", "rendezvous", "load", "data_ready",
                   "first_step")
"""The parts of a restart inside the allocation, in the order they happen."""


@dataclass(frozen=True)
class Restart:
    """How attempt `index` followed the one before it."""

    index: int
    in_allocation: bool
    cause: str
    """The cause's class (`cause_label`)."""
    move: str | None
    """Inside the allocation: spare, in place or shrink."""
    process_s: float | None
    """From the failure to the new attempt's first process."""
    first_step_s: float | None
    """From the failure to its first step."""
    path: str | None = None
    """Inside the allocation: inprocess (the survivors went on in their processes) or step."""
    breakdown: dict[str, Any] | None = None
    """The restart part by part, as the driver recorded it (`supervise/restarts.py`)."""


@dataclass(frozen=True)
class TimeBreakdown:
    allocated_s: float
    productive_s: float
    redone_s: float
    save_s: float
    eval_s: float
    waiting_s: float
    held_between_s: float = 0.0
    """Gaps between attempts inside one allocation (part of allocated)."""

    @property
    def other_s(self) -> float:
        return max(0.0, self.allocated_s - self.productive_s - self.redone_s - self.save_s - self.eval_s)

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.allocated_s if self.allocated_s > 0 else None


@dataclass(frozen=True)
class Marks:
    """What the loss plot marks: restarts (step, cause), faults (step, outcome), rolled-back spans."""

    restarts: list[tuple[int, str]] = field(default_factory=list)
    faults: list[tuple[int, str]] = field(default_factory=list)
    rollbacks: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Accounting:
    attempts: list[Attempt]
    time: TimeBreakdown
    steps_done: int
    steps_lost: int
    finished: bool
    restarts_by_cause: dict[str, int]
    last_checkpoint: dict[str, Any] | None
    """The newest `save` event: step, path, reason."""
    marks: Marks
    restart_list: list[Restart] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return max(0, len(self.attempts) - 1)


OUTSIDE = (Kind.SUBMITTED, Kind.CONFIG_ADJUSTED, Kind.CONFIG_CHANGED, Kind.TRIAL_LAUNCHED, Kind.TRIAL_PRUNED,
           Kind.EXPLOIT, Kind.EVAL_DONE, Kind.EVAL_FAILED)
"""Written from outside the job (a launch, a search's controller, a benchmark evaluation's own job),
often between or after attempts: they mark no attempt's time."""


def split_attempts(events: list[Event[Any]]) -> list[list[Event[Any]]]:
    """The ledger cut into attempts; events before the first attempt (`submitted`) are left out."""
    attempts: list[list[Event[Any]]] = []
    for e in events:
        current = attempts[-1] if attempts else None
        starts_new = e.kind is Kind.ATTEMPT or (
            e.kind is Kind.START and (current is None or any(x.kind is Kind.START for x in current))
        )
        if starts_new:
            attempts.append([e])
        elif current is not None:
            current.append(e)
    return attempts


def account(events: list[Event[Any]], kept: list[dict[str, Any]], lost: list[dict[str, Any]]) -> Accounting:
    """The run's attempts and time from its ledger, `metrics.jsonl` rows and `metrics-lost.jsonl` rows."""
    groups = split_attempts(events)
    firsts = [stamp_seconds(g[0].time) for g in groups]
    windows = list(zip(firsts, firsts[1:] + [float("inf")]))
    kept_by = _by_attempt(kept, windows)
    lost_by = _by_attempt(lost, windows)
    attempts: list[Attempt] = []
    for i, group in enumerate(groups):
        rows = kept_by[i] + lost_by[i]
        traces = [stamp_seconds(e.time) for e in group if e.kind not in OUTSIDE] + [stamp_seconds(r["time"]) for r in rows]
        traces += [stamp_seconds(s.details.process_started) for s in select(group, Start) if s.details.process_started]
        steps = [r["step"] for r in rows] + [e.step for e in group if isinstance(e.step, int)]
        resumed = next((e.step for e in select(group, Resume) if e.step is not None), 0)
        previous = attempts[-1] if attempts else None
        job_id = next((e.job_id for e in group if e.job_id is not None), None)
        restart = next((e.restart for e in group if e.restart is not None), None)
        job_step = next((e.job_step for e in group if e.job_step is not None and e.rank >= 0), None)
        # A restart inside the surviving processes starts no process of rank 0's (nor of a standby's):
        # their start times predate the previous attempt, whose time is its own.
        begin = min(traces) if previous is None else max(min(traces), previous.end_s)
        attempts.append(Attempt(
            index=i + 1, begin_s=begin, end_s=max(traces), resumed_from=resumed,
            last_step=max(steps + [resumed]),
            outcome=_outcome(group, last=i == len(groups) - 1),
            cause=None if previous is None else previous.outcome,
            job_id=job_id, restart=restart, job_step=job_step,
            in_allocation=previous is not None and job_id is not None and (previous.job_id, previous.restart) == (
                job_id, restart) and previous.job_step != job_step,
            first_step_s=min((stamp_seconds(r["time"]) for r in rows), default=None),
            productive_s=sum(r.get("step_seconds", 0.0) for r in kept_by[i]),
            redone_s=sum(r.get("step_seconds", 0.0) for r in lost_by[i]),
            save_s=sum(s.details.seconds or 0.0 for s in select(group, Save)),
            eval_s=sum(r.get("eval_seconds", 0.0) for r in rows),
        ))
    saves = select(events, Save)
    held = sum(max(0.0, b.begin_s - a.end_s) for a, b in pairwise(attempts) if b.in_allocation)
    return Accounting(
        attempts=attempts,
        time=TimeBreakdown(
            allocated_s=sum(a.duration_s for a in attempts) + held,
            productive_s=sum(a.productive_s for a in attempts),
            redone_s=sum(a.redone_s for a in attempts),
            save_s=sum(a.save_s for a in attempts),
            eval_s=sum(a.eval_s for a in attempts),
            waiting_s=sum(max(0.0, b.begin_s - a.end_s) for a, b in pairwise(attempts) if not b.in_allocation),
            held_between_s=held,
        ),
        steps_done=max([r["step"] for r in kept] + [0]),
        steps_lost=sum(max(0, a.last_step - b.resumed_from) for a, b in pairwise(attempts)),
        finished=bool(attempts) and attempts[-1].outcome == "finished",
        restarts_by_cause=dict(Counter(cause_label(a.cause) for a in attempts[1:] if a.cause)),
        last_checkpoint=({"step": saves[-1].step, "path": saves[-1].details.path, "reason": saves[-1].details.reason}
                         if saves else None),
        marks=Marks(
            restarts=[(b.resumed_from, cause_label(b.cause or "")) for b in attempts[1:]],
            faults=[(a.last_step, a.outcome) for a in attempts[:-1] if not a.outcome.startswith("stopped")],
            rollbacks=[(b.resumed_from, a.last_step) for a, b in pairwise(attempts)
                       if a.last_step > b.resumed_from],
        ),
        restart_list=[_restart(a, b, select(events, RestartInAllocation)) for a, b in pairwise(attempts)],
    )


def _restart(before: Attempt, after: Attempt, records: list[Event[RestartInAllocation]]) -> Restart:
    """The failure is when the driver learned of it, else the previous attempt's last trace."""
    record = next((r for r in records if after.in_allocation and (r.job_id, r.restart, r.job_step) == (
        after.job_id, after.restart, after.job_step)), None)
    failed_at = before.end_s
    if record is not None and record.details.failed_at:
        failed_at = stamp_seconds(record.details.failed_at)
    return Restart(
        index=after.index, in_allocation=after.in_allocation, cause=cause_label(after.cause or ""),
        move=record.details.move if record else None,
        process_s=record.details.process_s if record and record.details.process_s is not None else after.begin_s - failed_at,
        first_step_s=None if after.first_step_s is None else after.first_step_s - failed_at,
        path=record.details.path if record else None, breakdown=record.details.breakdown if record else None,
    )


def cause_label(outcome: str) -> str:
    """The class of a restart cause, for counting: `stopped (SIGUSR1)`, `crashed (InjectedFault)`,
    `killed (SIGKILL)`, `killed` (without a trace)."""
    if outcome.startswith("stopped by "):
        return f"stopped ({outcome[len('stopped by '):]})"
    if outcome.startswith("crashed: "):
        return f"crashed ({outcome[len('crashed: '):].split(':')[0]})"
    if outcome.startswith("killed: rank "):  # `killed: rank 1 by signal 9 (SIGKILL)` -> `killed (SIGKILL)`
        by = outcome.split(" by ", 1)[-1]
        return "killed (host OOM)" if "OOM" in by else f"killed ({by[by.find('(') + 1:by.rfind(')')] or by})"
    if outcome.startswith("killed"):
        return "killed"
    return outcome.split(":")[0]


def _by_attempt(rows: list[dict[str, Any]], windows: list[tuple[float, float]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[] for _ in windows]
    for row in rows:
        if "time" not in row or not windows:
            continue
        t = stamp_seconds(row["time"])
        for i, (begin, end) in enumerate(windows):
            if begin <= t < end:
                out[i].append(row)
                break
    return out


def _outcome(group: list[Event[Any]], last: bool) -> str:
    kinds = {e.kind for e in group}
    if Kind.FINISH in kinds:
        return "finished"
    if gave_up := select(group, GaveUp):
        return f"gave up: {gave_up[-1].details.reason}"
    if Kind.STOP in kinds:
        signals = [e.details.signal for e in select(group, Signal)]
        return f"stopped by {signals[0] if signals else 'a stop request'}"
    # A rank killed from outside comes before the crashes of the ranks that lost it at a collective.
    if (end := first_cause(rank_ends(group))) is not None and end.killer is not None:
        return f"killed: rank {end.rank} by {end.killer}"
    if crashes := select(group, Crash):
        return f"crashed: {(crashes[-1].details.error or 'unknown error').splitlines()[0]}"
    return "running or killed" if last else "killed without a trace"
