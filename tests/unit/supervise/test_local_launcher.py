import subprocess
import sys

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health.oom_watch import OomWatch, memory_cgroup_dirs
from resilient_slurm.process.signals import Forwarder
from resilient_slurm.supervise.local import _exit_at_once, _supervise, combine_exit_codes, say_how_it_ended
from resilient_slurm.ledger import EventLog, Kind, Save, Stop, read_events
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


def test_a_rank_killed_by_a_signal_is_named_in_one_line_with_the_step_a_relaunch_resumes_from(tmp_path, capsys):
    """Stand-ins for two ranks (issue 27, item 9): rank 1 is SIGKILLed; rank 0, like a gloo rank whose
    peer vanished, records a "Connection reset by peer" crash and exits 1. The launcher's one line
    names rank 1 and the signal, not rank 0's error."""
    path = tmp_path / "events.jsonl"
    EventLog(path, rank=0).emit(Save(reason="periodic", mode="async", path="step_00000025", bytes=1, seconds=0.1,
                                     blocking_s=0.01, has_optimizer=True), 25)
    since = path.stat().st_size
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    survivor = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        f"while os.path.exists('/proc/{victim.pid}') and open('/proc/{victim.pid}/stat').read().split()[2] != 'Z':\n"
        "    time.sleep(0.01)\n"
        "from resilient_slurm.ledger import Crash, EventLog\n"
        f"EventLog({str(path)!r}, rank=0).emit(Crash(error='RuntimeError: Read error: Connection reset by peer. GLHF!',"
        " traceback='...'), 30)\n"
        "sys.exit(1)\n")])
    victim.kill()
    codes = _supervise([survivor, victim], 60, EventLog(path, rank=-1), OomWatch([]))
    assert sorted(codes) == [-9, 1]
    say_how_it_ended(path, since, 2)
    assert capsys.readouterr().err == ("resilient_slurm: rank 1 was killed by signal 9 (SIGKILL); rank 0 stopped with "
                                       "it (logs/rank-0.log); launch again to resume from step 25\n")


@pytest.mark.parametrize("saved", [True, False])
def test_a_second_ctrl_c_says_whether_the_first_ones_save_had_finished(tmp_path, capsys, saved):
    """Issue 27, item 15: the ranks may still be shutting down after the emergency save committed;
    then the second Ctrl-C says so and the run exits 75 (resume from that save), not 130."""
    path = tmp_path / "events.jsonl"
    path.touch()
    if saved:
        EventLog(path, rank=0).emit(Stop(reason="SIGINT", checkpoint=str(tmp_path / "step_00000012")), 12)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    forwarder = Forwarder(lambda signum: None, interrupted_at=1000.0, forced_at=1001.0)
    codes = _exit_at_once(procs, forwarder, EventLog(path, rank=-1), 0)
    assert [p.returncode for p in procs] == [-9, -9]
    (forced,) = [e for e in read_events(path) if e.kind is Kind.FORCED_EXIT]
    assert forced.details.ranks == [0, 1]
    if saved:
        assert codes == [ExitCode.RESUME] * 2 and combine_exit_codes(codes) == ExitCode.RESUME
        assert capsys.readouterr().err == ("resilient_slurm: second Ctrl-C: stopped at once; the emergency save of "
                                           "step 12 had already finished, so launch again to resume from it\n")
    else:
        assert codes == [ExitCode.INTERRUPTED] * 2
        assert capsys.readouterr().err == ("resilient_slurm: second Ctrl-C: stopped at once, without saving; launch "
                                           "again to resume from the newest checkpoint\n")
