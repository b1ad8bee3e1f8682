"""bench/restart.py at a toy size on the sandbox: one in-process restart without a standby (the path
the other sandbox tests do not take) and one hang found by the heartbeats, so the bench cannot rot;
its figures are the bench's to report, not this test's."""

from __future__ import annotations

import json

import pytest

from tests.unit.bench.conftest import load_bench

pytestmark = pytest.mark.slurm


def test_the_restart_bench_prints_its_table_and_the_simulators_keys(idle_cluster, tmp_path, capsys):
    bench = load_bench("restart")
    out = tmp_path / "restart.json"
    assert bench.main(["--repeats", "1", "--paths", "nostandby", "--hangs", "heartbeat", "--steps", "90",
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kill -> first step" in printed and "hang found by heartbeat" in printed
    m = json.loads(out.read_text())
    for part in ("detect", "placement", "process_start", "rendezvous", "load", "first_step"):
        assert m[f"nostandby_{part}_s"] >= 0, part
    assert m["nostandby_load_source"] == "hot" and 0 < m["nostandby_restart_s"] < 120
    # A stopped process's liveness beats stop too: found after monitor.heartbeat_alive_s, before the timeout.
    assert 0 < m["heartbeat_detect_s"] < m["heartbeat_timeout_s"] + 30

    from resilient_slurm.simulate.bench import from_bench

    fields = from_bench(m, str(out))  # the simulator reads it
    assert fields["heartbeat_s"] == m["heartbeat_detect_s"]
