"""What tells a host OOM, gathered: the kernel log since a start, and the `oom_kill` counters of a
process's memory cgroups. Judged by `oom_kill`. Standard library only.

`OomWatch` is started before the processes it watches may be killed (the launcher before its ranks,
a Slurm task before training) and read after: only kills after its start count, so a pid that an
earlier process had, and the kernel gave again, is never mistaken for this one.
"""

from __future__ import annotations

import os

from resilient_slurm.health.log_sources import Cursor, LogReadError, read_log
from resilient_slurm.health.oom_kill import OomKill, parse_oom_kill_count, parse_oom_kills

MOUNTS = "/proc/self/mounts"
COUNTER_FILES = ("memory.events", "memory.oom_control")
"""cgroup v2, then v1: the file whose `oom_kill` line counts the cgroup's OOM kills."""


def memory_cgroup_dirs(pid: int | str = "self") -> list[str]:
    """The directories of the memory cgroup process `pid` is in, and of its ancestors below the
    hierarchy's root, innermost first: the v1 memory hierarchy, or v2's where it has the memory
    controller. Empty when the process is gone or no such hierarchy is mounted."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            memberships = f.read().splitlines()
        with open(MOUNTS, encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    v1 = [m[1] for m in mounts if len(m) > 3 and m[2] == "cgroup" and "memory" in m[3].split(",")]
    v2 = [m[1] for m in mounts if len(m) > 2 and m[2] == "cgroup2"]
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        roots = v1 if "memory" in controllers.split(",") else v2 if controllers == "" else []
        for root in roots:
            dirs = []
            while path not in ("/", ""):
                dirs.append(root + path)
                path = path.rsplit("/", 1)[0]
            dirs = [d for d in dirs if any(os.path.exists(os.path.join(d, c)) for c in COUNTER_FILES)]
            if dirs:
                return dirs
    return []


def oom_kill_counts(dirs: list[str]) -> dict[str, int]:
    """Each directory's `oom_kill` count; those without one (or gone) are left out."""
    out = {}
    for d in dirs:
        for name in COUNTER_FILES:
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    count = parse_oom_kill_count(f.read())
            except OSError:
                continue
            if count is not None:
                out[d] = count
                break
    return out


class OomWatch:
    def __init__(self, cgroup_dirs: list[str], kernel_log: str | None = None) -> None:
        """Start watching: the counters of `cgroup_dirs` now, and the end of the kernel log
        (/dev/kmsg, the journal or dmesg; the file `kernel_log` instead when given)."""
        self.dirs = cgroup_dirs
        self.kernel_log = kernel_log
        self.before = oom_kill_counts(cgroup_dirs)
        self.log_note: str | None = None
        """Why the kernel log cannot be read (then only counters can tell)."""
        self.cursor: Cursor | None = None
        try:
            self.cursor = read_log("auto", None, lambda chunk: None, kernel_log).cursor
        except (LogReadError, OSError) as e:
            self.log_note = str(e)

    def kills(self) -> list[OomKill]:
        """The OOM kills logged since the start."""
        if self.cursor is None:
            return []
        chunks: list[bytes] = []
        try:
            read_log("auto", self.cursor, chunks.append, self.kernel_log)
        except (LogReadError, OSError) as e:
            self.log_note = str(e)
            return []
        return parse_oom_kills(b"".join(chunks).decode("utf-8", "replace"))

    def counters(self) -> dict[str, int]:
        return oom_kill_counts(self.dirs)
