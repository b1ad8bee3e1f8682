"""A training rank the kernel's OOM killer takes, in a real Slurm job: rank 1 leaks host memory
(`fault.leak_mb_per_step`), and once it runs, it is moved into a memory cgroup of 160 MiB (tests/memcg.py),
where the kernel kills it. The leak is reported first (`memory_leak`, by rank 1). Rank 1 leaves no
trace of its own: the surviving task finds the kernel's line naming rank 1's pid, records
`host_oom`, and the job is requeued without excluding the node. The next attempt, outside the
cgroup, finishes."""

from __future__ import annotations

import pytest

from resilient_slurm.ledger import Kind
from tests.integration.runs import events, run_dir
from tests.memcg import memory_cgroup
from tests.slurm.jobs import describe, submit, wait_for_end, wait_until

pytestmark = pytest.mark.slurm


def test_a_rank_killed_by_the_oom_killer_is_a_host_oom_and_its_node_stays_in_service(slurm_cluster, tmp_path):
    with memory_cgroup(160) as memcg:
        job = submit(tmp_path, "hostoom", "cluster.nodes=2", "cluster.tasks_per_node=1",
                     "cluster.collective_timeout_s=60", "cluster.time_min=10", "cluster.max_restarts=2",
                     "train.max_steps=60", "checkpoint.every_steps=20", "fault.ranks=[1]", "fault.leak_mb_per_step=16",
                     "fault.step_sleep_s=0.05", "monitor.rss_every_steps=1", "monitor.leak_window=4",
                     "monitor.leak_min_growth_mb=32")
        rdir = run_dir(tmp_path, "hostoom")

        def first_start():
            starts = [e for e in events(rdir) if e.kind is Kind.START] if (rdir / "events.jsonl").exists() else []
            return starts[0] if starts else None

        victim = wait_until("the first attempt's start", first_start, 120).details.pids[1]
        (memcg / "cgroup.procs").write_text(str(victim))
        assert wait_for_end(job, rdir, 300) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (oom,) = [e for e in ev if e.kind is Kind.HOST_OOM]
    assert (oom.details.killed_rank, oom.details.pid, oom.details.source, oom.restart) == (1, victim, "kernel_log", 0)
    assert f"Killed process {victim} " in oom.details.evidence and memcg.name in oom.details.evidence
    leaks = [e for e in ev if e.kind is Kind.ANOMALY and e.details.kind == "memory_leak" and e.restart == 0]
    assert leaks and all(e.rank == 1 for e in leaks) and leaks[0].step < oom.step
    assert leaks[0].details.evidence["mb_per_step"] > 8
    (requeue,) = [e for e in ev if e.kind is Kind.REQUEUE]
    assert "host out of memory: rank 1" in requeue.details.reason
    assert "the node stays in service" in requeue.details.reason
    assert requeue.details.ok and requeue.details.exclude is None
    assert [e.restart for e in ev if e.kind is Kind.ATTEMPT] == [0, 1]
    assert not [e for e in ev if e.kind is Kind.NODE_UNHEALTHY]
