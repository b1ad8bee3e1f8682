"""A memory cgroup of its own for a test that needs the kernel's OOM killer for real: a child of this
process's memory cgroup (v1 here, v2 where mounted), with a limit. Needs root and a writable
hierarchy; the test is skipped otherwise. Moving a process in charges it only what it allocates
from then on (v1 moves no charges by default)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from resilient_slurm.health.oom_watch import memory_cgroup_dirs


@contextlib.contextmanager
def memory_cgroup(limit_mib: int) -> Iterator[Path]:
    mine = memory_cgroup_dirs()
    if os.geteuid() != 0 or not mine:
        pytest.skip("needs root and a memory cgroup hierarchy")
    path = Path(mine[0]) / f"rs-test-oom-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        limit = "memory.max" if (path / "memory.max").exists() else "memory.limit_in_bytes"
        (path / limit).write_text(str(limit_mib << 20))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    try:
        yield path
    finally:
        path.rmdir()  # its processes are gone: killed, or ended


def oom_victim(memcg: Path, mib: int = 300) -> list[str]:
    """argv of a process that moves itself into `memcg`, then allocates (and touches) `mib` MiB."""
    import sys

    return [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
            f"b = b'x' * ({mib} << 20)", str(memcg / "cgroup.procs")]
