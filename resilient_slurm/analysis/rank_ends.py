"""Which rank ended an attempt, and how, from its ledger: a rank killed by a signal or by the
kernel's OOM killer, a rank that crashed, and the ranks that only stopped with it. Pure.

When one rank of a multi-rank run dies, the others fail at their next collective ("Connection reset
by peer") and record crashes of their own; the rank that died first may record nothing at all (a
SIGKILL). What the local launcher saw (`rank_exit`, `host_oom`, `ranks_killed`) names it: the
launcher's console line and the report both blame that rank, not the survivors' errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger import Crash, Event, HostOom, MemorySave, RankExit, RanksKilled, Save, select


@dataclass(frozen=True)
class RankEnd:
    """How one rank's process ended on its own (not killed by the launcher)."""

    rank: int
    returncode: int
    oom_killed: bool
    """The kernel's OOM killer took it (`host_oom`)."""
    error: str | None
    """Its `crash` event's error, if it recorded one."""

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def killer(self) -> str | None:
        """What killed it from outside, if something did: `signal 9 (SIGKILL)`, `the kernel's OOM killer`."""
        if self.oom_killed:
            return "the kernel's OOM killer"
        return None if self.signal is None else f"signal {self.signal} ({signal_name(self.signal)})"

    def describe(self) -> str:
        """`rank 1 was killed by signal 9 (SIGKILL)`, `rank 0 crashed: ValueError: ...`."""
        if self.killer:
            return f"rank {self.rank} was killed by {self.killer}"
        if self.error:
            return f"rank {self.rank} crashed: {self.error.splitlines()[0]}"
        return f"rank {self.rank} exited with status {self.returncode}"


# Linux's numbers of the signals that end a process (no `signal` import: this module is pure).
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}


def signal_name(signum: int) -> str:
    return _SIGNALS.get(signum, "an unnamed signal")


def rank_ends(events: list[Event[Any]]) -> list[RankEnd]:
    """Each rank that ended abnormally in these events (one attempt's), in the order the launcher saw
    them; ranks the launcher killed itself (after another rank exited, or as hung) are left out."""
    killed = {r for e in select(events, RanksKilled) for r in e.details.ranks}
    oom = {e.details.killed_rank for e in select(events, HostOom)}
    errors = {e.rank: e.details.error for e in select(events, Crash)}
    return [RankEnd(e.details.failed_rank, e.details.returncode, e.details.failed_rank in oom,
                    errors.get(e.details.failed_rank))
            for e in select(events, RankExit) if e.details.failed_rank not in killed]


def first_cause(ends: list[RankEnd], consequence: Callable[[str], bool] = lambda error: False) -> RankEnd | None:
    """The rank whose end the others followed: killed from outside (OOM killer, a signal) before a
    crash, a crash of its own before one that `consequence` says followed a peer's death (a
    collective's "Connection reset by peer"), the first seen among equals."""
    def rank(end: RankEnd) -> int:
        if end.oom_killed:
            return 0
        if end.signal is not None:
            return 1
        if end.error and not consequence(end.error):
            return 2
        return 3

    return min(ends, key=rank, default=None)


def resume_step(events: list[Event[Any]]) -> int | None:
    """The step a relaunch resumes from: the newest committed save, in any tier; None before the first."""
    steps = [e.step for e in select(events, Save) if e.step is not None]
    steps += [e.step for e in select(events, MemorySave) if e.step is not None and e.details.ok]
    return max(steps, default=None)


def ending_line(launch: list[Event[Any]], ranks: int, resume_from: int | None,
                consequence: Callable[[str], bool] = lambda error: False) -> str | None:
    """The one line a local launcher prints when its run failed: which rank ended it and how, where
    the others' tracebacks are, and where a relaunch starts. `launch`: this launch's events."""
    end = first_cause(rank_ends(launch), consequence)
    if end is not None:
        what = end.describe() + (f" (traceback in logs/rank-{end.rank}.log)" if end.killer is None and end.error
                                 else "")
        others = [r for r in range(ranks) if r != end.rank]
        if others:
            logs = ", ".join(f"logs/rank-{r}.log" for r in others[:2]) + (", ..." if len(others) > 2 else "")
            what += f"; {'rank ' + str(others[0]) if len(others) == 1 else f'the other {len(others)} ranks'} " \
                    f"stopped with it ({logs})"
    elif killed := select(launch, RanksKilled):
        what = f"rank(s) {', '.join(map(str, killed[0].details.ranks))} killed by the launcher: {killed[0].details.reason}"
    else:
        return None
    then = f"launch again to resume from step {resume_from}" if resume_from is not None else \
        "launch again to start over (no checkpoint was saved)"
    return f"resilient_slurm: {what}; {then}"
