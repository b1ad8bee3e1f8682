"""A CPU cgroup of its own with a quota, for a test that needs a process really slowed (a straggler):
cgroup v2's cpu.max where a v2 hierarchy has the cpu controller, else v1's cfs quota. Needs root and
a writable hierarchy; the test is skipped otherwise. A process moved in runs at most `fraction` of
one CPU from then on; `release` moves it back to where it was."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PERIOD_US = 100_000


@dataclass
class CpuQuota:
    path: Path
    parent: Path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        """Every process back in the parent: full speed again."""
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it exited meanwhile
                (self.parent / "cgroup.procs").write_text(pid)


def _hierarchy() -> tuple[Path, str] | None:
    """(the cgroup directory this process is in, "v2" or "v1") for the cpu controller."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        if controllers == "":
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if "cpu" in (mount / "cgroup.controllers").read_text().split() if (mount / "cgroup.controllers").exists() \
                        else False:
                    return mount / where.lstrip("/"), "v2"
        elif "cpu" in controllers.split(","):
            mount = Path("/sys/fs/cgroup") / controllers
            if not mount.is_dir():
                mount = Path("/sys/fs/cgroup/cpu")
            return mount / where.lstrip("/"), "v1"
    return None


@contextlib.contextmanager
def cpu_quota(fraction: float) -> Iterator[CpuQuota]:
    found = _hierarchy() if os.geteuid() == 0 else None
    if found is None:
        pytest.skip("needs root and a cpu cgroup hierarchy")
    parent, version = found
    path = parent / f"rs-test-cpu-{uuid.uuid4().hex[:8]}"
    quota_us = int(PERIOD_US * fraction)
    try:
        path.mkdir()
        if version == "v2":
            (path / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError as e:
        pytest.skip(f"cannot create a cpu cgroup: {e}")
    quota = CpuQuota(path, parent)
    try:
        yield quota
    finally:
        quota.release()
        path.rmdir()
