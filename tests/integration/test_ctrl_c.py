"""Ctrl-C in a terminal, for real: SIGINT to the launcher's whole process group, as a terminal sends it.

The first one is a stop request like SIGTERM: every rank saves the same step, one line says so, the
run exits 75 and resumes. A second within 5 s stops the ranks at once, with one line and no
traceback, recorded as `forced_exit`. A Ctrl-C while the ranks are still importing torch waits for
their handlers instead of killing them with a traceback.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow

STEPS = "train.max_steps=60"
CTRL_C = "resilient_slurm: Ctrl-C: every rank saves at the end of its step, then the run exits 75; Ctrl-C again " \
         "within 5 s stops at once without saving"


def ctrl_c(proc) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's foreground group: the launcher and every rank


def rank_children(pid: int) -> list[int]:
    """This process's children that run a rank (before them the launcher may run git, for the record)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    ranks = []
    for kid in kids:
        try:
            if b"resilient_slurm.runtime.rank" in Path(f"/proc/{kid}/cmdline").read_bytes():
                ranks.append(kid)
        except OSError:  # it exited meanwhile
            continue
    return ranks


def ranks_running(rdir: Path) -> list[int]:
    """Processes still running a rank of this run."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"resilient_slurm.runtime.rank" in cmdline and str(rdir).encode() in cmdline:
            found.append(int(proc.name))
    return found


def lines_until(proc, wanted: str) -> str:
    """What the launcher writes up to and including the line `wanted` (the run ends if it never comes)."""
    seen = ""
    while line := proc.stdout.readline():
        seen += line
        if line.rstrip("\n") == wanted:
            return seen
    raise AssertionError(f"the run ended without {wanted!r}:\n{seen}")


def assert_no_traceback(out: str) -> None:
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_ctrl_c_saves_the_same_step_on_every_rank_and_exits_75_then_the_run_resumes(tmp_path):
    rdir = run_dir(tmp_path, "c")
    proc = launch(tmp_path, "c", "cluster.ranks=2", STEPS)
    wait_for_step(proc, rdir, 10)
    ctrl_c(proc)
    code, out = finish(proc)
    assert code == ExitCode.RESUME, out
    assert_no_traceback(out)
    after = out[out.index(CTRL_C):].splitlines()  # what the user sees from the Ctrl-C on
    assert after[0] == CTRL_C
    assert len(after) == 2 and after[1].endswith("(SIGINT), saved; launch again to resume"), after
    ev = events(rdir)
    signals = [e for e in ev if e.kind is Kind.SIGNAL]
    assert {e.rank for e in signals} == {0, 1} and {e.details.signal for e in signals} == {"SIGINT"}
    (stop,) = [e for e in ev if e.kind is Kind.STOP]
    assert stop.details.reason == "SIGINT" and {e.step for e in signals} == {stop.step}
    assert verify(Path(stop.details.checkpoint)).ok

    code, out = finish(launch(tmp_path, "c", "cluster.ranks=2", STEPS))
    assert code == ExitCode.DONE, out
    assert [e.step for e in events(rdir) if e.kind is Kind.RESUME] == [stop.step]


def test_a_second_ctrl_c_within_5_s_stops_at_once_with_one_line_and_it_is_recorded(tmp_path):
    rdir = run_dir(tmp_path, "cc")
    # Slow steps, so that the second Ctrl-C comes before the first one's step boundary.
    proc = launch(tmp_path, "cc", "cluster.ranks=2", STEPS, "fault.step_sleep_s=1.0")
    wait_for_step(proc, rdir, 2)
    ctrl_c(proc)
    seen = lines_until(proc, CTRL_C)  # the launcher has taken the first one: its line is out
    ctrl_c(proc)
    code, rest = finish(proc)
    out = seen + rest
    assert code == ExitCode.INTERRUPTED, out
    assert_no_traceback(out)
    after = out[out.index(CTRL_C):].splitlines()
    assert after == [CTRL_C, "resilient_slurm: second Ctrl-C: stopped at once, without saving; launch again to "
                             "resume from the newest checkpoint"]
    ev = events(rdir)
    (forced,) = [e for e in ev if e.kind is Kind.FORCED_EXIT]
    # In order; the second may follow within the stamps' millisecond, as soon as the first's line is out.
    assert forced.rank == -1 and forced.details.ranks == [0, 1] and forced.details.first <= forced.details.second
    assert not [e for e in ev if e.kind is Kind.STOP or e.kind is Kind.SAVE and e.details.reason == "emergency"]
    assert not ranks_running(rdir)


def test_ctrl_c_while_the_ranks_still_import_torch_is_a_stop_and_not_a_traceback(tmp_path):
    rdir = run_dir(tmp_path, "early")
    proc = launch(tmp_path, "early", STEPS)
    deadline = time.monotonic() + 60
    while not rank_children(proc.pid):  # the rank started: it is importing torch now
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    ctrl_c(proc)
    code, out = finish(proc)
    assert code == ExitCode.RESUME, out
    assert_no_traceback(out)
    (stop,) = [e for e in events(rdir) if e.kind is Kind.STOP]
    assert stop.step == 1 and stop.details.reason == "SIGINT"  # the first step boundary
