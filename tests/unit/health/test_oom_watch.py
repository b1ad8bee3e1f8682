"""A real OOM kill (cgroup v1 on this VM; v2 where mounted): a child process in a memory cgroup of
64 MiB allocates 300 MiB and the kernel kills it. The watch started before finds the kernel-log line
naming its pid and the cgroup's counter gone up; a watch started after the kill finds neither.
Needs root and a writable memory cgroup hierarchy; skipped otherwise."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from resilient_slurm.health.oom_kill import judge_exit
from resilient_slurm.health.oom_watch import OomWatch, memory_cgroup_dirs


@pytest.fixture
def memcg():
    """A child memory cgroup of this process's own, limited to 64 MiB."""
    mine = memory_cgroup_dirs()
    if os.geteuid() != 0 or not mine:
        pytest.skip("needs root and a memory cgroup hierarchy")
    path = Path(mine[0]) / f"rs-oom-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        limit = "memory.max" if (path / "memory.max").exists() else "memory.limit_in_bytes"
        (path / limit).write_text(str(64 << 20))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    yield path
    path.rmdir()


def test_a_process_the_oom_killer_takes_is_named_by_the_log_and_counted_by_its_cgroup(memcg):
    watch = OomWatch([str(memcg)])
    assert watch.log_note is None, watch.log_note  # root reads /dev/kmsg here
    # The child moves itself into the cgroup before it allocates; its pages are charged there.
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                              "b = b'x' * (300 << 20)", str(memcg / "cgroup.procs")])
    assert child.wait(timeout=60) == -9
    verdict = judge_exit(child.returncode, child.pid, watch.kills(), watch.before, watch.counters())
    assert verdict is not None and verdict.source == "kernel_log" and verdict.pid == child.pid
    assert f"Killed process {child.pid} " in verdict.evidence and memcg.name in verdict.evidence
    # Without the log, the counter alone tells: this cgroup killed a process while it ran.
    counter = judge_exit(child.returncode, child.pid, [], watch.before, watch.counters())
    assert counter is not None and counter.source == "cgroup" and f"{memcg}: oom_kill 0 -> 1" == counter.evidence
    late = OomWatch([str(memcg)])
    assert late.kills() == [] and judge_exit(-9, child.pid, late.kills(), late.before, late.counters()) is None
