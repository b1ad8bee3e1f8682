"""bench/checkpoint_shapes.py end to end at a toy size: every state, the tp2 one on 2 gloo ranks,
runs to the end and prints its row and its check; the speed is judged at the real size by the
bench itself."""

import json
import subprocess
import sys

import pytest

from tests.unit.bench.conftest import BENCH


@pytest.mark.slow
def test_the_bench_runs_every_state_at_a_toy_size(tmp_path):
    (tmp_path / "disk").mkdir()
    done = subprocess.run(
        [sys.executable, str(BENCH / "checkpoint_shapes.py"), "--reps", "1", "--hidden", "64", "--vocab", "512",
         "--synthetic-bytes", "8000000", "--dir", str(tmp_path / "disk"), "--json", str(tmp_path / "rows.json")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["state"] for r in rows] == ["llama6", "llama2", "few", "few-1.1", "many", "llama6-files", "tp2"]
    by = {r["state"]: r for r in rows}
    assert by["many"]["tensors"] == 4096 and by["few"]["tensors"] == 16
    assert by["llama6-files"]["files"] > by["llama6"]["files"]
    # tp2 writes the same model's bytes as llama6, each chunk once over the two ranks.
    assert by["tp2"]["bytes"] == pytest.approx(by["llama6"]["bytes"], rel=0.01)
    for r in rows:
        assert sum(line.startswith(f"| {r['state']} |") for line in done.stdout.splitlines()) == 1
    assert sum(line.startswith(("met ", "NOT met ")) for line in done.stdout.splitlines()) == len(rows)
    assert not list((tmp_path / "disk").iterdir())
