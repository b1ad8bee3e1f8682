"""bench/harness.py at toy size: both modes run for real and the table has a row for each."""

import pytest

from tests.unit.bench.conftest import load_bench

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow


def test_the_step_time_table_compares_with_and_without_the_side_job(tmp_path, capsys):
    bench = load_bench("harness")
    bench.main(["--reps", "1", "--steps", "30", "--every", "15", "--tasks", "tiny_mmlu", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].startswith("| eval.harness | median step | median while evaluating |")
    off = next(line for line in lines if line.startswith("| off |"))
    on = next(line for line in lines if line.startswith("| every N steps"))
    assert off.count("ms") == 3 and on.count("ms") == 3 and on.rstrip().endswith("|")
