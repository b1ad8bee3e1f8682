"""Heartbeats: what a rank tells the monitor outside the training processes, and when its silence
is a hang. Pure: the rank's sender (`runtime/heartbeat.py`) and the monitor's receiver
(`supervise/heartbeat.py`) do the I/O; this decides.

A beat says a rank made progress: a step, a micro-batch, a phase of a save. A phase that may take
longer than the timeout without making progress (the start, a resume's load, a save, an evaluation)
announces itself with an allowance: until the next beat, the rank may stay silent that long. A rank
silent longer than the timeout (or its last beat's allowance) is hung, whatever the reason: stopped
(SIGSTOP), deadlocked in a collective, or on a node that is gone. Before its first beat a rank
gets the start allowance, counted from when the monitor started the step.

A rank waiting in a collective for a hung peer makes no progress either. To tell the two apart each
rank also says it is alive (`ALIVE`, once a second from a thread of its own): a silent rank that is
still alive is waiting; one that is not (stopped, dead, its node gone) is the culprit. When every
silent rank is alive, they are deadlocked together, and all of them are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

ALIVE = "alive"
"""The phase of a liveness beat: the process runs, whether or not its loop makes progress."""


@dataclass(frozen=True)
class Beat:
    rank: int
    step: int
    phase: str
    """step, micro_batch, start, load, save, eval, await_restart, ..."""
    allow_s: float
    """How long the rank may now stay silent (0: the monitor's timeout)."""
    generation: int = 0
    """Which start of the ranks it belongs to (an in-process restart begins a new one)."""

    def encode(self) -> bytes:
        return json.dumps([self.rank, self.step, self.phase, self.allow_s, self.generation]).encode()

    @staticmethod
    def decode(data: bytes) -> Beat | None:
        try:
            rank, step, phase, allow_s, generation = json.loads(data)
            return Beat(int(rank), int(step), str(phase), float(allow_s), int(generation))
        except (ValueError, TypeError):
            return None  # not ours, or torn: never a reason to fail the run


@dataclass(frozen=True)
class Silence:
    rank: int
    silent_s: float
    step: int | None
    """The last step the rank reported (None: it never reported)."""
    phase: str
    limit_s: float
    alive: bool = False
    """The rank's process still says it is alive: it waits (for a hung peer), it is not itself stopped."""

    def describe(self) -> str:
        where = f"after step {self.step} ({self.phase})" if self.step is not None else "since its start"
        return f"rank {self.rank} silent for {self.silent_s:.0f}s {where}; the limit was {self.limit_s:.0f}s"


def silent_ranks(last: dict[int, tuple[Beat, float]], ranks: Iterable[int], now: float, started_at: float,
                 timeout_s: float, start_allow_s: float, alive_at: dict[int, float] | None = None) -> list[Silence]:
    """The ranks of `ranks` silent past their limit at `now`; `last` maps a rank to its newest
    progress beat and when it arrived (monitor's clock), `alive_at` to its newest liveness beat. A
    timeout of 0 turns heartbeats off."""
    if timeout_s <= 0:
        return []
    alive_at = alive_at or {}
    out = []
    for rank in ranks:
        alive = now - alive_at.get(rank, float("-inf")) <= timeout_s
        if rank not in last:
            limit = max(timeout_s, start_allow_s)
            if now - started_at > limit:
                out.append(Silence(rank, now - started_at, None, "start", limit, alive))
            continue
        beat, at = last[rank]
        limit = max(timeout_s, beat.allow_s)
        if now - at > limit:
            out.append(Silence(rank, now - at, beat.step, beat.phase, limit, alive))
    return out


def culprits(silent: list[Silence]) -> list[Silence]:
    """The silent ranks that are hung themselves: those no longer alive; all of them when every one
    is alive (deadlocked together)."""
    dead = [s for s in silent if not s.alive]
    return dead or list(silent)
