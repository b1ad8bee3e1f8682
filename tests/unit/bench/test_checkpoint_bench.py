"""bench/checkpoint.py end to end at a toy size (one gloo rank, a one-layer model of width 64): it
must run to the end (it once stopped before its async figures, initialising a second default process
group), print every row of its tables and every check, and write the costs the simulator reads. The
targets are judged at the real size, by the bench itself; a toy state says nothing about speed."""

import json
import subprocess
import sys

import pytest

from resilient_slurm.simulate.scenario import from_bench
from tests.unit.bench.conftest import BENCH, load_bench

bench = load_bench("checkpoint")

NEW_KEYS = ["dd_direct_gb_s", "sync_vs_dd_direct", "memory_blocking_s", "memory_copy_s", "memory_save_s",
            "memory_lost_s", "memory_load_s"]


def test_dd_writes_whole_blocks_of_the_payload():
    assert bench.dd_bytes(3 * 2**20 + 5, direct=False) == 3 * 2**20
    assert bench.dd_bytes(130 * 2**20, direct=True) == 2 * 2**26
    assert bench.dd_bytes(5, direct=True) == 2**26  # at least one block


@pytest.mark.slow
def test_the_bench_runs_to_the_end_at_a_toy_size(tmp_path):
    costs = tmp_path / "costs.json"
    (tmp_path / "disk").mkdir()
    (tmp_path / "shm").mkdir()
    done = subprocess.run(
        [sys.executable, str(BENCH / "checkpoint.py"), "--layers", "1", "--hidden", "64", "--vocab", "512",
         "--reps", "1", "--warm", "--dir", str(tmp_path / "disk"), "--memory-dir", str(tmp_path / "shm"),
         "--json", str(costs)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for row in ("| project |", "| torch.save |", "| safetensors |", "| DCP |", "| memory tier |",
                "| sync save (the whole save) |", "| async disk save |", "| memory tier: the save call |",
                "| memory tier: until the bytes are out of the tensors |"):
        assert sum(line.startswith(row) for line in out.splitlines()) == 1, row
    assert "dd bs=64M oflag=direct" in out and "async disk save's blocking, in parts: snapshot" in out
    checks = [line for line in out.splitlines() if line.startswith(("met ", "NOT met "))]
    assert len(checks) == 12
    assert any("sync save >= 0.85x dd oflag=direct" in c for c in checks)
    assert any("memory tier blocking <= 1/3 of the async disk save's" in c for c in checks)

    written = json.loads(costs.read_text())
    # The checkpoint bench's own keys (bench/restart.py writes the restart ones).
    for key in ["bytes", "save_s", "blocking_s", "lost_s", "load_s", *NEW_KEYS]:
        assert isinstance(written[key], (int, float)) and written[key] >= 0, key
    assert written["load_cache"] == "warm" and written["reps"] == 1
    assert set(from_bench(written, str(costs))) >= {"save_s", "blocking_s", "load_s", "ckpt_bytes"}
    # every key the bench writes is named in its docstring
    for key in ["bytes", "save_s", "durable_s", "blocking_s", "lost_s", "load_s", *NEW_KEYS]:
        assert f"    {key} " in bench.__doc__, key
    assert not list((tmp_path / "disk").iterdir()) and not list((tmp_path / "shm").iterdir())
