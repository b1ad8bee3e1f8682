"""metrics.jsonl and the report count each step once, whenever a run died: SIGKILLed (the whole
process group, as the OOM killer or a lost node would) before its first checkpoint, in the middle
of a save, and between two checkpoints, then run to the end.

"In the middle of a save" is caught for real: the test watches the checkpoints directory and kills
the run while a save's temporary directory (`.tmp.step_N`) exists, then checks that it is still
there, uncommitted, after the kill (a save whose commit won the race is retried at the next one).
"""

import os
import signal
import time
from pathlib import Path

import pytest

from resilient_slurm.analysis.summary import load, summarize
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.rundir.metrics import lost_path, read_metrics
from tests.integration.runs import events, finish, interrupt, launch, run_dir, wait_for_step

pytestmark = pytest.mark.slow

MAX_STEPS = 60  # tests/integration/runs.py's SMALL saves every 25 steps


def committed(rdir: Path) -> list[int]:
    return [e.step for e in events(rdir) if e.kind is Kind.SAVE]


def kill_during_a_save(proc, rdir: Path, timeout: float = 120) -> int | None:
    """SIGKILL while a save's temporary directory exists; the step it was saving if it is still
    uncommitted afterwards, None if the commit won the race."""
    checkpoints = rdir / "checkpoints"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        saving = [p for p in checkpoints.glob(".tmp.step_*")] if checkpoints.is_dir() else []
        if saving:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            cut = saving[0]
            if cut.exists() and not (checkpoints / cut.name.removeprefix(".tmp.")).exists():
                return int(cut.name.rsplit("_", 1)[1])
            return None
        time.sleep(0.001)
    raise AssertionError("no save began")


def test_each_step_is_counted_once_whether_killed_before_a_checkpoint_during_a_save_or_between_two(tmp_path):
    rdir = run_dir(tmp_path, "m")
    steps = f"train.max_steps={MAX_STEPS}"

    code, _ = interrupt(launch(tmp_path, "m", steps), rdir, 8, signal.SIGKILL)
    assert code == -signal.SIGKILL and not committed(rdir)  # before the first checkpoint

    cut = None
    for _ in range(3):
        cut = kill_during_a_save(launch(tmp_path, "m", steps), rdir)
        if cut is not None:
            break
    assert cut is not None, "three saves committed before the kill landed"
    assert cut not in committed(rdir)

    proc = launch(tmp_path, "m", steps)
    saved = max(committed(rdir), default=0)
    wait_for_step(proc, rdir, 1)
    while max(committed(rdir), default=0) <= saved:  # a new checkpoint, then a few steps past it
        wait_for_step(proc, rdir, 1)
        time.sleep(0.05)
    between = max(committed(rdir))
    code, _ = interrupt(proc, rdir, between + 7, signal.SIGKILL)
    assert code == -signal.SIGKILL and max(committed(rdir)) == between

    code, out = finish(launch(tmp_path, "m", steps))
    assert code == ExitCode.DONE, out

    kept = read_metrics(rdir / "metrics.jsonl")
    lost = read_metrics(lost_path(rdir / "metrics.jsonl"))
    assert [r["step"] for r in kept] == list(range(1, MAX_STEPS + 1))
    assert lost, "the kills lost no step: nothing was tested"
    acc = summarize(load(rdir)).acc
    assert acc.finished and acc.steps_done == MAX_STEPS and len(acc.attempts) >= 4
    assert acc.steps_lost == len(lost)
    assert acc.time.productive_s == pytest.approx(sum(r["step_seconds"] for r in kept))
    assert acc.attempts[0].resumed_from == 0 and acc.attempts[-1].resumed_from == between
