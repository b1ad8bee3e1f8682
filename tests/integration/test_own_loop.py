"""A user's own training loop (examples/own_loop) under the launcher: interrupted by SIGUSR1, SIGTERM
and SIGKILL on 2 ranks, resumed each time, bit-identical to a run never interrupted; and the
Session without a scheduler, without a data position, and in a process group it made itself.
Real processes, real signals, torch with gloo; nothing is faked."""

import difflib
import signal

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.own_loops import EXAMPLE, launch_own, own_dir
from tests.integration.runs import REPO, assert_bit_identical, events, final_tensors, finish, interrupt

pytestmark = pytest.mark.slow


def test_the_own_loop_interrupted_three_ways_ends_bit_identical(tmp_path):
    code, out = finish(launch_own(tmp_path, "straight", "cluster.ranks=2"))
    assert code == ExitCode.DONE, out
    rdir = own_dir(tmp_path, "resumed")
    code, out = interrupt(launch_own(tmp_path, "resumed", "cluster.ranks=2"), rdir, 30, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch_own(tmp_path, "resumed", "cluster.ranks=2"), rdir, 60, signal.SIGTERM)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch_own(tmp_path, "resumed", "cluster.ranks=2"), rdir, 90, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(launch_own(tmp_path, "resumed", "cluster.ranks=2"))
    assert code == ExitCode.DONE, out

    assert_bit_identical(final_tensors(own_dir(tmp_path, "straight"), 120), final_tensors(rdir, 120))
    ev = events(rdir)
    assert [e.details.signal for e in ev if e.kind is Kind.SIGNAL] == ["SIGUSR1"] * 2 + ["SIGTERM"] * 2
    stops = [e.step for e in ev if e.kind is Kind.STOP]
    emergency = [e.step for e in ev if e.kind is Kind.SAVE and e.details.reason == "emergency"]
    assert stops == emergency and len(stops) == 2
    resumes = [e.step for e in ev if e.kind is Kind.RESUME]
    assert resumes[:2] == stops and resumes[2] % 25 == 0 and resumes[2] <= 90
    assert ev[-1].kind is Kind.FINISH and ev[-1].step == 120
    steps = [row["step"] for row in _metrics(rdir)]
    assert steps == list(range(1, 121)), "metrics.jsonl holds each step once, in order"


def test_a_session_without_scheduler_or_data_position_resumes_its_model_and_optimizer(tmp_path):
    entry = "tests.integration.own_loops:no_scheduler_no_data_state"
    code, out = finish(launch_own(tmp_path, "straight", "cluster.ranks=2", entry=entry))
    assert code == ExitCode.DONE, out
    rdir = own_dir(tmp_path, "resumed")
    code, out = interrupt(launch_own(tmp_path, "resumed", "cluster.ranks=2", entry=entry), rdir, 40,
                          signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch_own(tmp_path, "resumed", "cluster.ranks=2", entry=entry))
    assert code == ExitCode.DONE, out
    assert_bit_identical(final_tensors(own_dir(tmp_path, "straight"), 120), final_tensors(rdir, 120))
    assert not (rdir / "checkpoints" / "step_00000120" / "scheduler.json").exists()


def test_a_session_that_makes_the_process_group_and_keeps_a_dict_position(tmp_path):
    entry = "tests.integration.own_loops:session_makes_the_group"
    code, out = finish(launch_own(tmp_path, "straight", entry=entry))
    assert code == ExitCode.DONE, out
    rdir = own_dir(tmp_path, "resumed")
    code, out = interrupt(launch_own(tmp_path, "resumed", entry=entry), rdir, 50, signal.SIGTERM)
    assert code == ExitCode.RESUME, out
    code, out = finish(launch_own(tmp_path, "resumed", entry=entry))
    assert code == ExitCode.DONE, out
    assert_bit_identical(final_tensors(own_dir(tmp_path, "straight"), 120), final_tensors(rdir, 120))


def test_the_readme_shows_the_diff_and_it_changes_at_most_15_lines():
    plain = (EXAMPLE / "own_loop" / "plain.py").read_text()
    ours = (EXAMPLE / "own_loop" / "train.py").read_text()
    code = [_without_docstring(t).splitlines() for t in (plain, ours)]
    diff = list(difflib.unified_diff(*code, "plain.py", "train.py", lineterm="", n=1))
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert len(added) <= 15, "\n".join(diff)
    readme = (REPO / "README.md").read_text()
    assert all(line in readme for line in added), "README's diff is not the example's"


def _without_docstring(text: str) -> str:
    first = text.index('"""', 3) + 3
    return text[first:]


def _metrics(rdir):
    import json

    return [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]
