"""`launch --plan`: the seed's run planned from its recipe alone (no data, no torch, nothing written),
and the numbers it prints checked against their arithmetic. How close the estimate is to what real
runs hold is tests/unit/parallel/test_estimate.py's and tests/integration/test_parallel_layouts.py's."""

import subprocess
import sys
from pathlib import Path

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.__main__ import main

REPO = Path(__file__).resolve().parents[3]


def test_the_seed_runs_plan_prints_its_layout_memory_batch_checkpoint_and_collectives(tmp_path, capsys):
    assert main(["+experiment=llama70b_pretrain", "--plan", f"run.root={tmp_path}"]) == ExitCode.DONE
    out = capsys.readouterr().out
    assert "layout: 10,000 rank(s) = 125 replica(s) (HSDP) x 10 FSDP shard(s) x tp 8; 1,250 node(s) x 8 (+16 spare)" in out
    assert "70.55B parameters" in out and "20,480,000 tokens per step; 2 micro-batch(es) of 1" in out
    # 16 B/param over tp 8 x dp_shard 10: 70.55e9 * 4 / 80 bytes of fp32 weights per GPU
    assert "parameters (fp32 master)                            3.29 GiB" in out
    assert "checkpoint: 84.83 MB written per rank per save" in out  # 12 B/param / 10,000 ranks
    for group in ("dp_shard of     10", "dp_replicate of    125", "tp of      8", "world of 10,000"):
        assert group in out
    assert "Float8" in out
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_plan_imports_no_torch():
    code = ("import sys; from resilient_slurm.launch.__main__ import main; "
            "code = main(['+experiment=llama70b_pretrain', '--plan']); print(int(code), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 False", done.stdout + done.stderr
