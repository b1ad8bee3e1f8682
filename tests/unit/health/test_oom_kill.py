"""Host OOM judged from what the kernel leaves: the OOM-kill lines (as dmesg, kmsg and syslog print
them) and cgroup oom_kill counters. A SIGKILL without either is not an OOM kill."""

import pytest

from resilient_slurm.health.oom_kill import (
    judge_exit,
    judge_failed_attempt,
    parse_oom_kill_count,
    parse_oom_kills,
)

# As this VM's kernel (6.18, cgroup v1) printed a memory cgroup's kill, then a global one as older
# syslogs print it, and the reaper's line that follows a kill.
LOG = """\
[ 8196.634189] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job/oomprobe,task_memcg=/job/oomprobe,task=python3,pid=12757,uid=0
[ 8196.634281] Memory cgroup out of memory: Killed process 12757 (python3) total-vm:323792kB, anon-rss:65152kB, file-rss:6588kB, shmem-rss:0kB, UID:0 pgtables:200kB oom_score_adj:0
Dec  1 11:49:58 node7 kernel: Out of memory: Killed process 4242 (pt_main_thread) total-vm:91234567kB, anon-rss:81234567kB
[ 8199.1] oom_reaper: reaped process 4242 (pt_main_thread), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
[ 8199.2] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
"""


def test_every_kill_is_found_with_its_pid_name_and_cgroup():
    kills = parse_oom_kills(LOG)
    assert [(k.pid, k.name, k.memcg) for k in kills] == [(12757, "python3", "/job/oomprobe"),
                                                         (4242, "pt_main_thread", None)]
    assert kills[0].line.startswith("[ 8196.634281] Memory cgroup out of memory: Killed process 12757")
    assert parse_oom_kills("garbage \x00\xff Killed process x (y)\n") == []


@pytest.mark.parametrize("text, count", [
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3),  # v1 memory.oom_control
    ("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n", 1),  # v2 memory.events
    ("oom_kill_disable 0\nunder_oom 0\n", None),  # a kernel before 4.13
])
def test_the_oom_kill_counter_of_both_cgroup_versions(text, count):
    assert parse_oom_kill_count(text) == count


KILLS = parse_oom_kills(LOG)


@pytest.mark.parametrize("status, pid, kills, before, after, source", [
    (-9, 12757, KILLS, {}, {}, "kernel_log"),  # the log names it
    (137, 4242, KILLS, {}, {}, "kernel_log"),  # as a shell reports a SIGKILL
    (-9, 777, [], {"/cg": 0}, {"/cg": 1}, "cgroup"),  # no readable log: its cgroup's counter went up
    (-9, 777, KILLS, {"/cg": 0}, {"/cg": 0}, None),  # killed, but not by the OOM killer
    (1, 777, [], {"/cg": 0}, {"/cg": 1}, None),  # a crash: another process was the OOM victim
    (-9, 777, [], {}, {"/cg": 1}, None),  # a counter not read at the start proves nothing
])
def test_judge_exit(status, pid, kills, before, after, source):
    verdict = judge_exit(status, pid, kills, before, after)
    assert (verdict.source if verdict else None) == source
    if source == "kernel_log":
        assert verdict.pid == pid and f"Killed process {pid}" in verdict.evidence
    if source == "cgroup":
        assert verdict.pid is None and verdict.evidence == "/cg: oom_kill 0 -> 1"


def test_a_survivor_names_the_rank_whose_pid_the_log_names_else_only_that_a_kill_happened():
    rank, verdict = judge_failed_attempt({0: 11, 3: 4242}, KILLS, {}, {})
    assert (rank, verdict.pid, verdict.source) == (3, 4242, "kernel_log")
    rank, verdict = judge_failed_attempt({0: 11}, KILLS, {"/job": 4}, {"/job": 5})
    assert (rank, verdict.source, verdict.evidence) == (None, "cgroup", "/job: oom_kill 4 -> 5")
    assert judge_failed_attempt({0: 11}, KILLS, {"/job": 4}, {"/job": 4}) is None
