import subprocess
import sys

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health.oom_watch import OomWatch, memory_cgroup_dirs
from resilient_slurm.supervise.local import _supervise, combine_exit_codes
from resilient_slurm.ledger import EventLog, Kind, read_events
from tests.memcg import memory_cgroup, oom_victim


@pytest.mark.parametrize(
    "codes, combined",
    [
        ([0, 0], ExitCode.DONE),
        ([75, 75], ExitCode.RESUME),
        ([75, 0], ExitCode.RESUME),
        ([1, 75], ExitCode.FAILED),
        ([-9, 0], ExitCode.FAILED),
        ([2, 2], ExitCode.CONFIG),
        ([2, -9], ExitCode.FAILED),
        ([70, 70], ExitCode.GAVE_UP),  # every rank gave up together (the monitor, an OOM at micro-batch 1)
        ([70, 1], ExitCode.FAILED),
    ],
)
def test_one_status_for_the_run(codes, combined):
    assert combine_exit_codes(codes) == combined


def test_a_rank_the_oom_killer_takes_is_a_host_oom_and_one_the_launcher_kills_is_not(tmp_path):
    """Two stand-ins for ranks: rank 1 runs into its memory cgroup's limit (a real OOM kill); rank 0
    waits, and is SIGKILLed by the launcher after the grace period: the same status, no OOM."""
    with memory_cgroup(64) as memcg:
        watch = OomWatch(memory_cgroup_dirs())  # as run_local starts it: before the ranks
        procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
                 subprocess.Popen(oom_victim(memcg))]
        codes = _supervise(procs, 0.5, EventLog(tmp_path / "events.jsonl", rank=-1), watch)
    assert codes == [-9, -9]
    ev = read_events(tmp_path / "events.jsonl")
    assert [(e.kind, e.record.get("failed_rank")) for e in ev if e.kind is Kind.RANK_EXIT] == \
        [(Kind.RANK_EXIT, 1), (Kind.RANK_EXIT, 0)]
    (oom,) = [e for e in ev if e.kind is Kind.HOST_OOM]
    assert (oom.details.killed_rank, oom.details.pid, oom.details.source) == (1, procs[1].pid, "kernel_log")
    assert f"Killed process {procs[1].pid} " in oom.details.evidence
    assert [e.details.ranks for e in ev if e.kind is Kind.RANKS_KILLED] == [[0]]
