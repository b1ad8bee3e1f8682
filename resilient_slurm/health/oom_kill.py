"""Host out of memory: the kernel's OOM-kill lines and cgroup counters, judged. Pure, no I/O.

A process the kernel's OOM killer takes dies of SIGKILL, like one killed by a user, by Slurm, or by a
node that failed; only two traces tell them apart:
- the kernel log's `Out of memory: Killed process <pid> (<name>) ...` line (`Memory cgroup out of
  memory: ...` when a cgroup's limit was hit), which names the pid;
- the `oom_kill` counter of the memory cgroup the process ran in: `memory.events` on cgroup v2 (it
  counts the whole subtree, so a job's cgroup sees every task's kill), `memory.oom_control` on v1
  (only the cgroup the victim was in counts it).
The log line names the process; a counter only says that something in the cgroup was killed while
it ran. Host OOM is the job's memory, never the node's fault: the node stays in service.
"""

from __future__ import annotations

import dataclasses
import re

_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")
_VICTIM_MEMCG = re.compile(r"oom-kill:.*\btask_memcg=([^,\s]*).*\bpid=(\d+)")
SIGKILL_STATUSES = (-9, 137)
"""How a SIGKILLed child's status reads: -9 from Popen, 128+9 from a shell."""


@dataclasses.dataclass(frozen=True)
class OomKill:
    """One process the kernel's OOM killer took."""

    pid: int
    name: str
    line: str
    """The kernel's `... Killed process ...` line, cut to 300 characters."""
    memcg: str | None = None
    """The memory cgroup the victim was in (`oom-kill:` line), when the log says."""


@dataclasses.dataclass(frozen=True)
class HostOomVerdict:
    pid: int | None
    """The killed process, when the kernel log names it."""
    source: str
    """kernel_log or cgroup."""
    evidence: str


def parse_oom_kills(text: str) -> list[OomKill]:
    """Every OOM kill in kernel-log text (any prefix: dmesg time, syslog host, kmsg)."""
    memcgs = {int(m.group(2)): m.group(1) for m in _VICTIM_MEMCG.finditer(text)}
    out = []
    for line in text.splitlines():
        m = _KILLED.search(line)
        if m and "reaped" not in line:  # "oom_reaper: reaped process" follows a kill, it is not one
            pid = int(m.group(1))
            out.append(OomKill(pid, m.group(2), line.strip()[:300], memcgs.get(pid)))
    return out


def parse_oom_kill_count(text: str) -> int | None:
    """The `oom_kill N` line of memory.events (v2) or memory.oom_control (v1); None without one
    (kernels before 4.13)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def risen(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The counters that went up, with (before, after)."""
    return {path: (before[path], n) for path, n in after.items() if path in before and n > before[path]}


def judge_exit(status: int | None, pid: int, kills: list[OomKill], before: dict[str, int],
               after: dict[str, int]) -> HostOomVerdict | None:
    """A process that exited with `status` (None: unknown, e.g. a peer's) was killed for host memory
    when the kernel log names its pid; failing that, when it died of SIGKILL while an oom_kill
    counter of its memory cgroups went up. None: no sign of an OOM kill."""
    for kill in kills:
        if kill.pid == pid:
            where = f" in memory cgroup {kill.memcg}" if kill.memcg else ""
            return HostOomVerdict(pid, "kernel_log", f"{kill.line}{where}")
    counters = risen(before, after)
    if status in SIGKILL_STATUSES and counters:
        return HostOomVerdict(None, "cgroup", counter_evidence(counters))
    return None


def judge_failed_attempt(pids: dict[int, int], kills: list[OomKill], before: dict[str, int],
                         after: dict[str, int]) -> tuple[int | None, HostOomVerdict] | None:
    """What a surviving rank of a failed attempt can tell: the rank (of `pids`, rank -> pid, the
    ranks whose kernel log this is) that the OOM killer took, by the log line naming its pid; or,
    failing that, that one of its own memory cgroups' counters went up (the rank unknown). None: no
    sign of an OOM kill."""
    for kill in kills:
        for rank, pid in sorted(pids.items()):
            if kill.pid == pid:
                where = f" in memory cgroup {kill.memcg}" if kill.memcg else ""
                return rank, HostOomVerdict(pid, "kernel_log", f"{kill.line}{where}")
    counters = risen(before, after)
    return (None, HostOomVerdict(None, "cgroup", counter_evidence(counters))) if counters else None


def counter_evidence(counters: dict[str, tuple[int, int]]) -> str:
    return "; ".join(f"{path}: oom_kill {a} -> {b}" for path, (a, b) in sorted(counters.items()))
