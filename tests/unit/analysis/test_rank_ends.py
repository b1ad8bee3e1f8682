"""Which rank ended a local run, and how: the launcher's line and the report blame the rank that died,
not the survivors that lost it at a collective (issue 27, item 9)."""

from resilient_slurm.analysis.goodput import account, cause_label
from resilient_slurm.analysis.rank_ends import ending_line, first_cause, rank_ends, resume_step
from resilient_slurm.ledger import Crash, EventLog, HostOom, RankExit, RanksKilled, Save, Start, read_events

GLOO = ("RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:38796: Connection reset by peer. "
        "This is typically caused by a remote worker hanging or bugs in the application. GLHF!")


START = (0, Start(world_size=2, pid=1, host="h"), None)


def peer(error: str) -> bool:
    return "Connection reset by peer" in error


def ledger(tmp_path, *writes):
    path = tmp_path / "events.jsonl"
    for rank, details, step in writes:
        EventLog(path, rank=rank).emit(details, step)
    return read_events(path)


def save(step):
    return 0, Save(reason="periodic", mode="async", path=f"step_{step}", bytes=1, seconds=0.1, blocking_s=0.01,
                   has_optimizer=True), step


def test_a_rank_killed_by_sigkill_is_blamed_and_not_the_survivors_crash(tmp_path):
    # The survivor's crash is written before the launcher sees the dead rank (it polls): order does not decide.
    ev = ledger(tmp_path, START, save(50), (0, Crash(error=GLOO, traceback="..."), 61),
                (-1, RankExit(failed_rank=0, returncode=1), None), (-1, RankExit(failed_rank=1, returncode=-9), None))
    end = first_cause(rank_ends(ev), peer)
    assert (end.rank, end.signal, end.killer) == (1, 9, "signal 9 (SIGKILL)")
    assert ending_line(ev, 2, resume_step(ev), peer) == (
        "resilient_slurm: rank 1 was killed by signal 9 (SIGKILL); rank 0 stopped with it (logs/rank-0.log); "
        "launch again to resume from step 50")
    (attempt,) = account(ev, [], []).attempts
    assert attempt.outcome == "killed: rank 1 by signal 9 (SIGKILL)"
    assert cause_label(attempt.outcome) == "killed (SIGKILL)"


def test_a_crash_of_its_own_comes_before_the_crashes_it_caused(tmp_path):
    ev = ledger(tmp_path, START, (0, Crash(error=GLOO, traceback=""), 7), (1, Crash(error="ValueError: bad row", traceback=""), 7),
                (-1, RankExit(failed_rank=0, returncode=1), None), (-1, RankExit(failed_rank=1, returncode=1), None))
    assert ending_line(ev, 4, None, peer) == (
        "resilient_slurm: rank 1 crashed: ValueError: bad row (traceback in logs/rank-1.log); the other 3 ranks "
        "stopped with it (logs/rank-0.log, logs/rank-2.log, ...); launch again to start over (no checkpoint was saved)")
    assert account(ev, [], []).attempts[0].outcome == "crashed: ValueError: bad row"


def test_ranks_the_launcher_killed_are_not_blamed_and_the_oom_killer_is_named(tmp_path):
    ev = ledger(tmp_path, START, (-1, RankExit(failed_rank=1, returncode=-9), None),
                (-1, HostOom(killed_rank=1, pid=42, source="kernel_log", evidence="Killed process 42"), None),
                (-1, RanksKilled(ranks=[0], reason="still running 30s after another rank exited"), None),
                (-1, RankExit(failed_rank=0, returncode=-9), None))
    assert [e.rank for e in rank_ends(ev)] == [1]
    assert ending_line(ev, 2, 100).startswith(
        "resilient_slurm: rank 1 was killed by the kernel's OOM killer; rank 0 stopped with it")
    outcome = account(ev, [], []).attempts[0].outcome
    assert outcome == "killed: rank 1 by the kernel's OOM killer" and cause_label(outcome) == "killed (host OOM)"


def test_a_hang_the_launcher_ended_is_said_with_its_reason(tmp_path):
    ev = ledger(tmp_path, (-1, RanksKilled(ranks=[0, 1], reason="hung: rank 1 silent for 30 s"), None),
                (-1, RankExit(failed_rank=0, returncode=-9), None), (-1, RankExit(failed_rank=1, returncode=-9), None))
    assert ending_line(ev, 2, 25) == ("resilient_slurm: rank(s) 0, 1 killed by the launcher: hung: rank 1 silent for "
                                      "30 s; launch again to resume from step 25")
    assert ending_line([], 2, 25) is None
