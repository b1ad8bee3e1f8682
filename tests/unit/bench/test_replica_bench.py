"""bench/replica.py's parts on a run written here (no processes): its figures from metrics rows and
the ledger, the medians, and the JSON keys the simulator reads."""

from datetime import datetime, timezone

import pytest

from resilient_slurm.ledger import parse
from tests.unit.bench.conftest import load_bench

bench = load_bench("replica")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp()


def stamp(s: float) -> str:
    return datetime.fromtimestamp(T0 + s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def a_run():
    """Two groups, steps of 1 s; group 1 killed at t=20.2 (after step 20): the survivor's next step
    ends at 24 (a 2 s short step after a 1.8 s stall), short steps of 2 s until the replacement
    joins in step 25, which takes 3 s."""
    rows, t = [], 0.0
    for step in range(1, 21):
        t += 1.0
        rows.append({"step": step, "step_seconds": 1.0, "time": stamp(t), "replica_missing": 0})
    t = 24.0
    rows.append({"step": 21, "step_seconds": 2.0, "time": stamp(t), "replica_missing": 1})
    for step in range(22, 25):
        t += 2.0
        rows.append({"step": step, "step_seconds": 2.0, "time": stamp(t), "replica_missing": 1})
    t += 3.0
    rows.append({"step": 25, "step_seconds": 1.2, "time": stamp(t), "replica_missing": 0})
    events = [parse({"time": stamp(29), "event": "replica_heal", "step": 24, "rank": 1, "group": 1, "source": 0,
                     "seconds": 0.6, "bytes": 1000}),
              parse({"time": stamp(t), "event": "replica_join", "step": 25, "rank": 1, "group": 1, "live": [0, 1],
                     "seconds": 9.5})]
    return rows, events


def test_one_runs_figures():
    rows, events = a_run()
    m = bench.measure(rows, events, T0 + 20.2, groups=2)
    assert m["steady_step_s"] == 1.0 and m["short_step_s"] == 2.0 and m["ideal_short_step_s"] == 2.0
    assert m["survivors_next_step_s"] == pytest.approx(3.8) and m["leave_stall_s"] == pytest.approx(1.8)
    assert m["join_stall_s"] == pytest.approx(2.0)  # 3 s against a steady 1 s step
    assert (m["heal_transfer_s"], m["heal_bytes"], m["heal_s"], m["short_steps"]) == (0.6, 1000.0, 9.5, 4.0)


def test_medians_and_the_simulators_keys():
    rows, events = a_run()
    m = bench.measure(rows, events, T0 + 20.2, groups=2)
    other = {**m, "leave_stall_s": 3.0, "join_stall_s": 1.0, "heal_s": 10.5}
    s = bench.summarize([m, other])
    assert s["heal_s"] == 10.0 and s["quorum_s"] == pytest.approx(1.9)  # median of 1.8, 2.0, 3.0, 1.0
    out = bench.simulator_keys(s, 2)
    assert tuple(out) == bench.KEYS
    assert (out["ranks"], out["replica_groups"], out["steady_step_s"], out["short_step_s"]) == (2, 2, 1.0, 2.0)
    assert all(out[k] is None for k in bench.FILLED_BY_OTHERS)


def test_the_keys_are_the_simulators():
    """Each key the bench writes is one the simulator reads (or reports) for bench/replica.py."""
    sim = pytest.importorskip("resilient_slurm.simulate.bench")
    if "heal_s" not in sim.KNOWN:
        pytest.skip("this simulator does not read bench/replica.py yet")
    reported = {"survivors_next_step_s", "sdc_heal_s", "straggler_swap_s", "hang_culprit_s"}
    assert set(bench.KEYS) <= set(sim.KNOWN) | reported


def test_bad_arguments_are_one_line():
    with pytest.raises(SystemExit, match="choose 2 or more groups"):
        bench.main(["--groups", "1"])
