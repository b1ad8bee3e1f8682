"""bench/quickstart.py and bench/cli_latency.py end to end at a toy size: a 3-step run in each
condition, and one timing of each command; each must print its table."""

import subprocess
import sys

import pytest

from tests.unit.bench.conftest import BENCH

TOY = ["model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2", "data.seq_len=64",
       "data.global_batch_size=4", "data.micro_batch_size=2", "train.max_steps=3", "eval.every_steps=3",
       "eval.task_samples=2", "data.val_samples=4"]


@pytest.mark.slow  # two real training runs
def test_the_quick_start_bench_runs_at_a_toy_size(tmp_path):
    out = tmp_path / "quickstart.json"
    done = subprocess.run([sys.executable, str(BENCH / "quickstart.py"), "--repeats", "1", "--json", str(out), "--",
                           *TOY], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "| condition | median wall s | runs (s) | target |" in lines
    assert any(line.startswith("| idle | ") for line in lines) and any(line.startswith("| loaded | ") for line in lines)
    assert any(line.startswith("| loaded / idle | ") for line in lines)
    assert "train.threads=0" in done.stdout  # the run's own log line: the default thread count was used
    assert out.read_text().count('"steps": 3') == 2


def test_the_latency_bench_runs_once_each():
    done = subprocess.run([sys.executable, str(BENCH / "cli_latency.py"), "--repeats", "1"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("python -c pass", "launch --help", "launch (bare)", "launch +experiment=tiny_sft optim.lrr=1e-3",
                 "export --help", "evaluate --help"):
        assert any(line.startswith(f"| {name} | ") for line in done.stdout.splitlines()), name
