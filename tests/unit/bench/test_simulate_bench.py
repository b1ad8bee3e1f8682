"""bench/simulate.py end to end at a toy size (800 GPUs for a day, one seed), with a measured file
scaled to the 8B/H100 target: it must keep running against the simulator's interfaces and print
every section, issue 23's and 28's loss table and their sensitivity rows included. The published-data section
runs the Llama 3 scenario at full size, as tests/unit/simulate/test_published.py does; skipped here."""

import json
import subprocess
import sys

from tests.unit.bench.conftest import BENCH


def test_the_bench_runs_at_a_toy_size(tmp_path):
    measured = tmp_path / "checkpoint.json"
    measured.write_text(json.dumps({"bytes": 2e8, "save_s": 0.5, "lost_s": 0.1, "load_s": 0.6,
                                    "memory_blocking_s": 0.03, "memory_save_s": 0.2, "memory_load_s": 0.04,
                                    "buddy_load_s": 0.06}))
    done = subprocess.run([sys.executable, str(BENCH / "simulate.py"), "--seeds", "1", "--gpus", "800", "--days", "1",
                           "--from-bench", str(measured), "--scale-to", "8b-h100", "--skip-published"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for section in ("## 1. Speed", "## 3. The seed's question", "## 4. Issues 23 and 28", "## 5. Issue 28"):
        assert section in out
    assert "| lost to | spares | heartbeat | memory | inprocess |" in out and "| topup |" in out
    assert "| memory_blocking_s | " in out and f"scaled to 8b-h100 from {measured}" in out
    rows = [line for line in out.splitlines() if line.startswith("| 0.01 | 1 | ")]
    assert len(rows) == 3 and all(line.endswith("% |") for line in rows)
    issue28 = out.split("## 5. Issue 28")[1].splitlines()
    assert len([line for line in issue28 if line.startswith("| ") and line.endswith("% |")]) == 8
