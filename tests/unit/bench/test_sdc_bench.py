"""bench/sdc.py at a toy size: two replicas on two gloo ranks, a few steps: the table has its row,
the flipped bit was found, pinned on the last rank and healed, and the JSON carries the keys the
simulator reads (simulate/bench.py) as non-negative numbers."""

import json

import pytest

from tests.unit.bench.conftest import load_bench, spawnable

pytestmark = pytest.mark.slow


def test_the_bench_measures_the_check_and_a_heal_at_a_toy_size(tmp_path, capsys, monkeypatch):
    spawnable("sdc", tmp_path, monkeypatch)
    bench = load_bench("sdc")
    out = tmp_path / "sdc.json"
    bench.main(["--steps", "10", "--layouts", "2x1", "--json", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("| layout | ranks | step | check | kept copy | sentinel / step |")
    (row,) = [line for line in lines if line.startswith("| 2x1 | 2 |")]
    assert row.count(" ms") == 6 and "rerun, rank(s) [1]" in row
    keys = json.loads(out.read_text())
    assert keys["ranks"] == 2 and keys["replica_groups"] == 2
    for key in ("steady_step_s", "fingerprint_s", "sdc_heal_s", "sdc_check_s", "sdc_keep_s"):
        assert isinstance(keys[key], float) and keys[key] >= 0, key
    assert keys["fingerprint_s"] == pytest.approx(keys["sdc_check_s"] + keys["sdc_keep_s"])
