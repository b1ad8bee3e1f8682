"""bench/sharded.py end to end at a toy size (three worker processes, gloo): it must keep running
against the project's interfaces and print its tables. The targets are judged at the real size, by
the bench itself; here only the byte arithmetic, which does not depend on the size."""

import subprocess
import sys

import pytest

from tests.unit.bench.conftest import BENCH, load_bench

sharded = load_bench("sharded")


def test_dd_writes_whole_blocks_of_its_share():
    assert sharded.dd_bytes("dd", 3 * 2**20 + 5) == 3 * 2**20
    assert sharded.dd_bytes("dd x2", 3 * 2**20 + 5) == 2 * 2**20  # 1.5 MiB each, whole MiB: 1 each
    assert sharded.dd_bytes("dd direct", 130 * 2**20) == 2 * 2**26


@pytest.mark.slow
def test_the_bench_runs_at_a_toy_size(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "sharded.py"), "--layers", "1", "--hidden", "192", "--reps", "1", "--steps", "1",
         "--seq", "32", "--io-threads", "1", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "met      parameter + gradient + AdamW bytes per rank <= 0.55" in out
    loads = [line for line in out.splitlines() if line.startswith("| 2 | ") and " MB |" in line]
    assert len(loads) == 2 and all("| True |" in line for line in loads)  # each rank's rows equal the files
    for what in ("2 ranks x 1 thread", "1 rank x 1 thread", "dd direct"):
        assert f"| {what} |" in out
    assert not list(tmp_path.iterdir())  # the scratch directory is gone
