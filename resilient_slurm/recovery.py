"""What to do about what went wrong. Pure: inputs are the event, the run's ledger and the budgets;
the output is an action with a reason.

When an attempt of a Slurm job ends (`decide`):
- Time-limit warning or preemption notice (the job's warning signal): requeue; never uses the budget.
- SIGTERM: Slurm itself is ending the job. A `scontrol requeue` or a preemption puts it back in the
  queue; a user's `scancel` does not. The job must not second-guess that, so it just exits.
- A failure (crash, hang, dead rank): requeue while the failures without progress stay within the
  restart budget; a new checkpoint in between is progress and resets the count. The same failure
  at the same step on different nodes is a code bug: stop and say so (not when Slurm says the
  node is gone: that is hardware, whatever the step). Failures that follow one
  node across steps are hardware: requeue excluding that node. Two failures in a row tell the
  same even with progress in between, when chance cannot pair them (`across_progress`). Out of
  budget: give up.

Out of memory is its own class. A CUDA OOM where a smaller micro-batch cannot help (already 1, or
in the optimizer step) gives up at once: the same settings fail the same way. A rank killed by the
kernel's OOM killer (`host_oom`) is the job's memory, never the node's: requeued without excluding
it, and given up when it recurs after the same step.

When the monitor finds an anomaly during training (`on_findings`): roll back to the checkpoint
before it and skip its data (at most `max_rollbacks` times), or just report it. When a step runs out
of device memory (`on_out_of_memory`): redo it at a smaller micro-batch, or give up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import (
    FAILURES,
    Crash,
    Event,
    GaveUp,
    Hang,
    HostOom,
    Kind,
    NodeUnhealthy,
    OomRetry,
    OutOfMemory,
    Requeue,
    Signal,
    Stop,
)

WARNING_SIGNALS = ("SIGUSR1", "SIGUSR2")
HANG_PREFIX = "hang: "
NODE_LOST = re.compile(r"node not responding|node failure|due to node fail", re.IGNORECASE)
"""Slurm's word that a node is gone: its hardware, never the code (two such in a row, on two
nodes, are chance at the seed's scale: a failure every hour over thousands of nodes)."""
"""How a hang reads among failures (its reason follows)."""
# A rank that fails because a peer died or hung reports the collective, not the cause.
_PEER_FAILURE = re.compile(r"connection closed by peer|connection reset|timed out|timeout|remote worker|"
                           r"nccl|gloo|broken pipe|^hang:", re.IGNORECASE)


class Action(str, Enum):
    FINISH = "finish"
    REQUEUE = "requeue"
    EXIT = "exit"
    """Leave it to Slurm: it requeues a requeued or preempted job itself; a cancelled one stays cancelled."""
    GIVE_UP = "give_up"
    ROLLBACK = "rollback"
    REPORT = "report"
    RETRY = "retry"
    """Redo the step at a smaller micro-batch."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    exclude_nodes: tuple[str, ...] = ()
    """Requeue without these nodes: they failed a health check, or the failures follow them."""
    micro_batch: int | None = None
    """RETRY: the micro-batch to redo the step with."""


@dataclass(frozen=True)
class Failure:
    step: int | None
    error: str
    node: str | None

    @property
    def origin(self) -> bool:
        """Not merely a rank that lost its peer."""
        return not _PEER_FAILURE.search(self.error)


AttemptKey = tuple[str, int, int]
"""(job id, requeue count, job step): one start of the run inside a Slurm job. A requeue starts the
job again (the count goes up); a restart inside the allocation starts a new job step."""


# Errors after which a process cannot be trusted to go on: its device state may be corrupt.
CUDA_CLASS = re.compile(r"cuda error|illegal memory access|cudaerror|cublas_status|cudnn_status|nccl error|"
                        r"uncorrectable ecc|\bxid\b|device-side assert|misaligned address", re.IGNORECASE)


# A peer that timed out in a collective: some rank is hung (a stopped process, a stuck GPU).
COLLECTIVE_TIMEOUT = re.compile(r"timed out|timeout|watchdog caught collective", re.IGNORECASE)


def inprocess_refusal(hung: bool, errors: Iterable[str], survivors: int, same_size: bool) -> str | None:
    """Why the ranks that survived a failure must not restart in their own processes (None: they
    may): after a hang or a CUDA-class error every process starts anew, as it does when no rank
    survived or the world changes size (the survivors keep their ranks). A CUDA-class error is named
    before a hang: its rank's peers wait for it in a collective, so their silence or timeout is its
    consequence, and which of the two the driver sees first is a race. Pure."""
    errors = list(errors)
    cuda = next((e for e in errors if CUDA_CLASS.search(e)), None)
    if cuda is not None:
        return f"a CUDA-class error ({_short(cuda, 120)}): every process restarts, on fresh device state"
    timed_out = next((e for e in errors if COLLECTIVE_TIMEOUT.search(e)), None)
    if hung or timed_out is not None:
        return (f"a hang{f' ({_short(timed_out, 120)})' if timed_out else ''}: every process restarts (a hung "
                f"rank cannot be told to rejoin, and its peers' state may differ)")
    if survivors == 0:
        return "no rank survived"
    if not same_size:
        return "the world changes size: every process restarts, resharded"
    return None


def attempt_key(event: Event[Any]) -> AttemptKey | None:
    if event.job_id is None:
        return None
    return event.job_id, event.restart or 0, event.job_step or 0


def _attempts(history: list[Event[Any]]) -> list[list[Event[Any]]]:
    """The events of each attempt, in the order the attempts began."""
    attempts: dict[AttemptKey, list[Event[Any]]] = {}
    for e in history:
        key = attempt_key(e)
        if key is not None:
            attempts.setdefault(key, []).append(e)
    return list(attempts.values())


def _failures(events: list[Event[Any]]) -> list[Failure]:
    return [Failure(e.step, _failure_text(e), e.node) for e in events if e.kind in FAILURES]


def _origins(attempt: list[Failure]) -> list[Failure]:
    return [f for f in attempt if f.origin] or attempt


def failure_streak(history: list[Event[Any]]) -> list[list[Failure]]:
    """The failures of consecutive failed attempts, newest first, that committed no checkpoint
    beyond the best one before them. Attempts that ended cleanly (preempted, timed out) neither
    count nor break the streak."""
    ordered = _attempts(history)
    best_before = []
    best = -1
    for events in ordered:
        best_before.append(best)
        best = max([best, *_saved_steps(events)])
    streak: list[list[Failure]] = []
    for events, before in zip(reversed(ordered), reversed(best_before)):
        saved = max([-1, *_saved_steps(events)])
        if saved > before:
            break
        failures = _failures(events)
        if failures:
            streak.append(failures)
    return streak


def _saved_steps(events: list[Event[Any]]) -> list[int]:
    """Steps an attempt committed: to disk, or to the memory tier (a restart resumes from either,
    so both are progress)."""
    return [e.step for e in events if e.step is not None and (
        e.kind is Kind.SAVE or (e.kind is Kind.MEMORY_SAVE and getattr(e.details, "ok", False)))]


def failures_without_progress(history: list[Event[Any]]) -> int:
    return len(failure_streak(history))


@dataclass(frozen=True)
class Diagnosis:
    """What a streak of failed attempts says about its cause."""

    kind: str
    """code_bug: the same failure at the same step on every attempt; node: the failures follow a node."""
    reason: str
    node: str | None = None
    """The node a `node` diagnosis blames."""
    nodes: tuple[str, ...] = ()
    """Nodes the failures started on (ranks that only lost a peer are not counted)."""


def classify(streak: list[list[Failure]]) -> Diagnosis | None:
    """The cause of a streak of two or more failed attempts, when the failures show one."""
    if len(streak) < 2:
        return None
    origins = [_origins(attempt) for attempt in streak]
    signatures = {(_short(f.error, 120), f.step) for attempt in origins for f in attempt}
    nodes = tuple(sorted({f.node for attempt in origins for f in attempt if f.node}))
    if len(signatures) == 1:
        error, step = next(iter(signatures))
        if step is None and len(nodes) == 1:
            # Failing before the first step, every time, on one node: a node that cannot start (a
            # dead link, a GPU that does not initialise). A bug would fail the same way elsewhere,
            # which the next attempt, without this node, shows.
            return Diagnosis("node", f"every start fails on node {nodes[0]} before the first step: {error}",
                             nodes[0], nodes)
        if NODE_LOST.search(error):
            return None  # the budget and the exclude list handle lost nodes, one at a time
        where = f" on nodes {', '.join(nodes)}" if len(nodes) > 1 else f" on node {nodes[0]}" if nodes else ""
        return Diagnosis("code_bug", f"code bug: the same failure after step {step} on every attempt{where}: {error}",
                         nodes=nodes)
    common = set.intersection(*({f.node for f in attempt if f.node} for attempt in origins))
    if len(common) == 1:
        node = common.pop()
        steps = sorted({f.step for attempt in origins for f in attempt if f.step is not None})
        return Diagnosis("node", f"failures follow node {node} across steps {steps}: hardware, not code", node, nodes)
    return None


def across_progress(history: list[Event[Any]]) -> Diagnosis | None:
    """The newest failed attempt read with the attempt just before it, even when that one made
    progress (which keeps its failure out of the streak), where chance cannot explain the pair:
    - the same failure after the same step: a code bug (a resumed run reads the same data at that
      step, whichever checkpoint it resumed from). Not for hangs: their text names no cause, and
      one at the step the run resumed from says nothing about that step's data;
    - a start that fails before the first step, with one node among those that failure and the
      failure before it started on: the node broke while training and cannot start again (a dead
      link, a GPU that no longer initialises).
    Without this a bug strikes twice more, and a dead node fails two more starts, before the
    streak shows them. Failures that merely share a node are left to the streak: across progress
    one pair in K does so by chance on K nodes, and a healthy node seldom fails before a step."""
    attempts = _attempts(history)
    if len(attempts) < 2:
        return None
    newest, before = _failures(attempts[-1]), _failures(attempts[-2])
    if not newest or not before:
        return None
    diagnosis = classify([newest, before])
    if diagnosis is None:
        return None
    if diagnosis.kind == "code_bug":
        return None if any(f.error.startswith(HANG_PREFIX) for f in newest) else diagnosis
    return diagnosis if all(f.step is None for f in _origins(newest)) else None


def decide(code: int, signal: str | None, error: str | None, history: list[Event[Any]], max_restarts: int) -> Decision:
    """`code` is the attempt's ExitCode; `history` includes this attempt's own failure events."""
    if code == ExitCode.DONE:
        return Decision(Action.FINISH, "training finished")
    unhealthy = unhealthy_nodes(history)
    if unhealthy:
        # The node's fault, not the job's: no restart budget is used.
        why = "; ".join(f"{node}: {reason}" for node, reason in unhealthy.items())
        return Decision(Action.REQUEUE, f"failed node health check ({why}); requeued without it",
                        exclude_nodes=tuple(unhealthy))
    if code == ExitCode.RESUME:
        if signal in WARNING_SIGNALS:
            return Decision(Action.REQUEUE, f"{signal}: time-limit warning or preemption notice; saved and requeued")
        return Decision(Action.EXIT, f"{signal or 'stop request'}: Slurm requeues a requeued or preempted job "
                                     f"itself; a cancelled one stays cancelled")
    attempts = _attempts(history)
    newest = attempts[-1] if attempts else []
    out_of_memory = [e.details for e in newest if isinstance(e.details, OutOfMemory)]
    if out_of_memory:
        return Decision(Action.GIVE_UP, out_of_memory[0].reason)
    if code == ExitCode.GAVE_UP:
        return Decision(Action.GIVE_UP, _short(error))
    streak = failure_streak(history)
    failures = len(streak)
    error = _short(error)
    host_oom = [e for e in newest if isinstance(e.details, HostOom)]
    if host_oom:
        return _after_host_oom(host_oom[0], attempts, failures, max_restarts)
    diagnosis = classify(streak) or across_progress(history)
    # Only the nodes failures started on count: a peer that lost its rank fails on another node.
    if diagnosis and diagnosis.kind == "code_bug" and len(diagnosis.nodes) > 1:
        return Decision(Action.GIVE_UP, f"{diagnosis.reason}; a restart will not fix it")
    if failures == 0:
        return Decision(Action.REQUEUE, f"failed after saving progress; requeued, restart budget untouched: {error}")
    if failures > max_restarts:
        why = f"; {diagnosis.reason}" if diagnosis else ""
        return Decision(Action.GIVE_UP, f"{failures} consecutive failures without progress exceed the restart "
                                        f"budget of {max_restarts}{why}; last: {error}")
    if diagnosis and diagnosis.kind == "node":
        return Decision(Action.REQUEUE, f"failure {failures} without progress (budget {max_restarts}); "
                                        f"{diagnosis.reason}: requeued without it",
                        exclude_nodes=(diagnosis.node,) if diagnosis.node else ())
    return Decision(Action.REQUEUE, f"failure {failures} without progress (budget {max_restarts} restarts): {error}")


def _after_host_oom(oom: Event[HostOom], attempts: list[list[Event[Any]]], failures: int,
                    max_restarts: int) -> Decision:
    """A rank killed by the OOM killer: the job's memory, so the node is never excluded. Killed
    after the same step as in the attempt before (whatever happened in between), the step needs
    more host memory than it gets: another start would end the same way."""
    what = _failure_text(oom)
    before = [e for e in attempts[-2] if isinstance(e.details, HostOom)] if len(attempts) > 1 else []
    if oom.step is not None and any(e.step == oom.step for e in before):
        return Decision(Action.GIVE_UP, f"{what}, after step {oom.step} on two attempts in a row: look for a leak "
                                        f"(memory_leak findings in events.jsonl) or give the job more host memory "
                                        f"(cluster.mem_gb); a restart will not fix it")
    if failures > max_restarts:
        return Decision(Action.GIVE_UP, f"{failures} consecutive failures without progress exceed the restart "
                                        f"budget of {max_restarts}; last: {what}")
    return Decision(Action.REQUEUE, f"failure {failures} without progress (budget {max_restarts} restarts): {what}; "
                                    f"the node stays in service")


def on_out_of_memory(phase: str, micro_batch: int, rows_per_rank: int, activation_checkpointing: bool) -> Decision:
    """Every rank agreed a step ran out of device memory in `phase` (forward/backward, optimizer)
    at `micro_batch` rows per forward, of `rows_per_rank` rows per rank and step. Redo it at the
    largest micro-batch of at most half that divides the rank's rows (the global batch, and so
    what the step computes, stay the same); give up where a smaller one cannot help."""
    if phase == "optimizer":
        return Decision(Action.GIVE_UP, "out of memory in the optimizer step: the micro-batch does not change its "
                                        "memory (weights, gradients, AdamW state); shard over more ranks")
    smaller = next((m for m in range(micro_batch // 2, 0, -1) if rows_per_rank % m == 0), None)
    if smaller is None:
        checkpointing = "" if activation_checkpointing else \
            "turn on activation checkpointing (model.activation_checkpointing=true), "
        return Decision(Action.GIVE_UP, f"out of memory in the {phase} at micro-batch {micro_batch}, the smallest: "
                                        f"{checkpointing}shard over more ranks, or shorten the sequence (data.seq_len)")
    return Decision(Action.RETRY, f"out of memory in the {phase} at micro-batch {micro_batch}: redone at {smaller} "
                                  f"({rows_per_rank // smaller} micro-batches per rank), the same global batch",
                    micro_batch=smaller)


def micro_batch_after(history: list[Event[Any]], configured: int, rows_per_rank: int) -> int:
    """The micro-batch a start of the run trains at: the one the newest `oom_retry` lowered it to,
    while data.micro_batch_size is still the value it was lowered from (another value is a new
    choice); cut to a divisor of the rank's rows, which a new world size may have changed."""
    lowered = [e.details.new_micro_batch for e in history
               if isinstance(e.details, OomRetry) and e.details.configured_micro_batch == configured]
    if not lowered:
        return configured
    return next(m for m in range(min(lowered[-1], rows_per_rank), 0, -1) if rows_per_rank % m == 0)


def unhealthy_nodes(history: list[Event[Any]]) -> dict[str, str]:
    """Nodes the latest attempt found unhealthy (`node_unhealthy` events), with the reasons."""
    keys = [k for e in history if (k := attempt_key(e)) is not None]
    if not keys:
        return {}
    return {e.details.bad_node: e.details.reason for e in history
            if isinstance(e.details, NodeUnhealthy) and attempt_key(e) == keys[-1]}


def on_findings(kinds: Iterable[str], rollback_on: Iterable[str], rollbacks_done: int, max_rollbacks: int) -> Decision:
    """After a step: roll back for an acting finding while the rollback budget lasts, else report."""
    acting = sorted(set(kinds) & set(rollback_on))
    if not acting:
        return Decision(Action.REPORT, "reported; no action configured")
    if rollbacks_done < max_rollbacks:
        return Decision(Action.ROLLBACK, f"{', '.join(acting)}: rollback {rollbacks_done + 1} of {max_rollbacks}")
    return Decision(Action.GIVE_UP, f"{', '.join(acting)} again after {rollbacks_done} rollbacks (monitor.max_rollbacks="
                             f"{max_rollbacks}): the run keeps diverging; stopping, do not requeue")


def _failure_text(e: Event[Any]) -> str:
    d = e.details
    if isinstance(d, Hang):
        return HANG_PREFIX + d.reason
    if isinstance(d, HostOom):
        who = f"rank {d.killed_rank} (pid {d.pid})" if d.killed_rank is not None else "a process of the job"
        return f"host out of memory: {who} killed by the kernel's OOM killer"
    if isinstance(d, OutOfMemory):
        return f"out of device memory in the {d.phase}: {d.error}"
    return str(d.error) if isinstance(d, Crash) else "unknown failure"


def _short(error: str | None, limit: int = 300) -> str:
    first = (error or "unknown error").strip().splitlines()[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def restart_cause(history: list[Event[Any]], current: AttemptKey) -> str:
    """Why attempt `current` runs: how the attempt before it ended, from the ledger."""
    previous = [e for e in history if (k := attempt_key(e)) is not None and k != current]
    if not previous:
        return "first start"
    last_key = attempt_key(previous[-1])
    last = [e for e in previous if attempt_key(e) == last_key]
    # The job's own decision explains best; then a stop; then the failure (ranks may log after it).
    for kinds in ((Kind.REQUEUE, Kind.GAVE_UP), (Kind.STOP,), FAILURES):
        found = [e for e in last if e.kind in kinds]
        if not found:
            continue
        e = found[-1]
        if isinstance(e.details, Stop):
            signals = [s.details.signal for s in last if isinstance(s.details, Signal)]
            return f"stopped by {signals[0] if signals else 'a stop request'} at step {e.step}"
        if isinstance(e.details, (Requeue, GaveUp)):
            return e.details.reason
        return f"{'hung' if e.kind is Kind.HANG else 'crashed'} at step {e.step}: {_short(_failure_text(e))}"
    return "the previous attempt ended without a trace (killed, or its node failed)"
