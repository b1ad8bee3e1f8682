"""The failure catalog, the cold-tier copies and the costs of getting back to training."""

import math
import random

import pytest

from resilient_slurm.simulate import costs
from resilient_slurm.simulate.failures import FAULTS, FaultDraw, component_shares, parse_mix, with_mix
from resilient_slurm.simulate.scenario import Scenario, from_bench
from resilient_slurm.simulate.tiers import HOT_KEEP, Tiers


def test_default_shares_are_the_llama3_table():
    shares = component_shares(FAULTS)
    assert sum(shares.values()) == pytest.approx(1.0)
    for component, count in {"gpu": 268, "network": 49, "host": 46, "software": 56}.items():
        assert shares[component] == pytest.approx(count / 419)
    assert sum(f.weight for f in FAULTS if f.code_bug) == pytest.approx(3 / 419)


def test_a_mix_rescales_components_and_keeps_rows_in_proportion():
    mixed = with_mix(FAULTS, parse_mix("gpu=3, software=1"))
    assert component_shares(mixed) == pytest.approx({"gpu": 0.75, "software": 0.25})
    gpu = {f.name: f.weight for f in mixed if f.component == "gpu"}
    before = {f.name: f.weight for f in FAULTS if f.component == "gpu"}
    assert gpu["gpu-reset"] / gpu["gpu-replace"] == pytest.approx(before["gpu-reset"] / before["gpu-replace"])
    with pytest.raises(ValueError, match="is not COMPONENT=SHARE"):
        parse_mix("gpu")


def test_faults_are_drawn_by_weight():
    draw, rng = FaultDraw(FAULTS), random.Random(0)
    n = 40_000
    counts: dict[str, int] = {}
    for _ in range(n):
        name = draw(rng).name
        counts[name] = counts.get(name, 0) + 1
    for f in FAULTS:
        assert counts.get(f.name, 0) / n == pytest.approx(f.weight, abs=4 * math.sqrt(f.weight / n) + 1e-3)


def test_the_cold_tier_falls_behind_by_skipping_and_loses_the_copy_in_flight():
    tiers = Tiers(copy_s=100.0)
    for t in (0.0, 30.0, 60.0, 90.0):  # commits faster than copies: 30 and 60 are skipped
        tiers.commit(t, work=t, step=int(t))
    assert tiers.newest(150.0, cold=True).step == 0 and tiers.newest(150.0, cold=False).step == 90
    assert [(c.step, c.cold_at) for c in tiers.cold] == [(0, 100.0), (90, 200.0)]
    assert len(tiers.hot) == min(HOT_KEEP, 4)  # the hot tier keeps its newest checkpoint.keep_last
    tiers.abandon(150.0)  # the process died while 90 was being copied
    assert tiers.newest(250.0, cold=True).step == 0
    tiers.resume(300.0)  # the next attempt copies its newest
    assert tiers.newest(400.0, cold=True).step == 90


def test_the_cold_tier_keeps_its_own_copies_however_often_the_hot_tier_turns_over():
    tiers = Tiers(copy_s=100.0)
    for i in range(1000):
        tiers.commit(i * 10.0, work=i, step=i)
    # a copy every 100 s: the newest done is at most two copies old, and ten copies span ~1000 s
    assert tiers.newest(10_000.0, cold=True).step >= 999 - 20
    assert len(tiers.cold) == 10 and tiers.cold[-1].step - tiers.cold[0].step >= 90
    assert [c.step for c in tiers.hot] == list(range(1000 - HOT_KEEP, 1000))


def test_restart_costs():
    s = Scenario()
    rng = random.Random(0)
    requeue = dict(costs.requeue(s, rng))
    assert s.cred_delay_s <= requeue["scheduler"] <= s.cred_delay_s + s.backfill_s
    assert s.queue_min_s <= requeue["queue"] <= s.queue_max_s and requeue["startup"] == s.restart_s
    assert dict(costs.in_allocation(s)) == {"startup": s.in_alloc_restart_s}
    assert sum(v for _, v in costs.load(s, cold=True)) == s.cold_load_s
    assert costs.detection(s, hang=True) == [("detect", s.hang_detect_s)] and costs.detection(s, hang=False) == []


def test_bench_json_keys_map_to_the_scenario():
    assert from_bench({"save_s": 3, "blocking_s": 0.1, "lost_s": 0.2, "load_s": 4}, "f") == {
        "save_s": 3.0, "blocking_s": 0.2, "load_s": 4.0}
    with pytest.raises(ValueError, match="none of save_s"):
        from_bench({"unrelated": 1}, "f")
    with pytest.raises(ValueError, match="save_s=-1 is not a non-negative number"):
        from_bench({"save_s": -1}, "f")
