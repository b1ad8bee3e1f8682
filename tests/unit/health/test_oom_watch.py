"""A real OOM kill: a child process in a memory cgroup of 64 MiB allocates 300 MiB and the kernel kills
it. The watch started before finds the kernel-log line naming its pid and the cgroup's counter gone
up; a watch started after the kill finds neither. Needs root and a writable memory cgroup
hierarchy (tests/memcg.py); skipped otherwise."""

import subprocess

from resilient_slurm.health.oom_kill import judge_exit
from resilient_slurm.health.oom_watch import OomWatch
from tests.memcg import memory_cgroup, oom_victim


def test_a_process_the_oom_killer_takes_is_named_by_the_log_and_counted_by_its_cgroup():
    with memory_cgroup(64) as memcg:
        watch = OomWatch([str(memcg)])
        assert watch.log_note is None, watch.log_note  # root reads /dev/kmsg here
        child = subprocess.Popen(oom_victim(memcg))
        assert child.wait(timeout=60) == -9
        verdict = judge_exit(child.returncode, child.pid, watch.kills(), watch.before, watch.counters())
        assert verdict is not None and verdict.source == "kernel_log" and verdict.pid == child.pid
        assert f"Killed process {child.pid} " in verdict.evidence and memcg.name in verdict.evidence
        # Without the log, the counter alone tells: this cgroup killed a process while it ran.
        counter = judge_exit(child.returncode, child.pid, [], watch.before, watch.counters())
        assert counter is not None and counter.source == "cgroup" and counter.evidence == f"{memcg}: oom_kill 0 -> 1"
        late = OomWatch([str(memcg)])
        assert late.kills() == [] and judge_exit(-9, child.pid, late.kills(), late.before, late.counters()) is None
