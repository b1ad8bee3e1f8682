"""Table-driven tests of every detector: a history, one new observation, the findings expected."""

import dataclasses
import math

import pytest

from resilient_slurm.config import MonitorConfig
from resilient_slurm.monitor.detectors import Monitor, Observation, hang_timeout_s

CFG = MonitorConfig(window=20, min_history=10, plateau_steps=0)


def obs(step, loss=2.0, grad=1.0, tps=1000.0, ranks=(0.1, 0.1), waits=(0.0, 0.0), gpu=None):
    return Observation(step, loss, grad, tps, tps / 100, tuple(ranks), tuple(waits), gpu or {})


def run(history, new, cfg=CFG):
    m = Monitor(cfg)
    for i, o in enumerate(history):
        m.observe(o)
    return [f.kind for f in m.observe(new)]


def steady(n=20, **kw):
    # a slightly noisy plateau, so the MAD is not zero
    return [obs(i + 1, loss=2.0 + 0.01 * (i % 3), **kw) for i in range(n)]


@pytest.mark.parametrize(
    "history, new, kinds",
    [
        (steady(), obs(21, loss=float("nan")), ["loss_nan"]),
        (steady(), obs(21, loss=float("inf")), ["loss_nan"]),
        ([], obs(1, loss=float("nan")), ["loss_nan"]),  # no history needed to see a NaN
        (steady(), obs(21, loss=4.0), ["loss_spike"]),
        (steady(), obs(21, loss=2.05), []),  # inside the noise
        (steady(5), obs(6, loss=9.0), []),  # too little history to call a spike
        # falling loss with big early variance: a value within the recent spread is no spike
        ([obs(i + 1, loss=6.0 - 0.2 * i) for i in range(20)], obs(21, loss=2.5), []),
        (steady(), obs(21, grad=50.0), ["grad_explosion"]),
        (steady(), obs(21, grad=15.0), []),
        (steady(), obs(21, grad=float("nan")), ["grad_explosion"]),
        (steady(), obs(21, grad=0.0), ["grad_vanishing"]),
        ([], obs(1, grad=float("nan")), ["grad_explosion"]),  # before any history: no median to name
        (steady(), obs(21, ranks=(0.1, 0.15)), []),
        (steady(), obs(21, waits=(0.0, 45.0)), ["data_stall"]),
        (steady(), obs(21, gpu={"util_pct": 20.0}), ["gpu_underutilized"]),
        (steady(), obs(21, gpu={"temperature_c": 91.0, "util_pct": 99.0}), ["gpu_hot"]),
        (steady(), obs(21, gpu={"ecc_uncorrectable": 1.0}), ["gpu_ecc"]),
        (steady(), obs(21, gpu={"memory_used_frac": 0.995}), ["gpu_memory_full"]),
        (steady(), obs(21, gpu={"util_pct": 99.0, "temperature_c": 60.0}), []),
    ],
)
def test_detectors(history, new, kinds):
    assert run(history, new) == kinds


def test_throughput_drop_needs_consecutive_slow_steps():
    m = Monitor(CFG)
    for o in steady():
        m.observe(o)
    found = [[f.kind for f in m.observe(obs(21 + i, tps=300.0))] for i in range(6)]
    assert found == [[], [], [], [], ["throughput_drop"], []]  # reported once, on the 5th slow step


def test_a_spike_does_not_raise_the_bar_for_the_next_one():
    m = Monitor(CFG)
    for o in steady():
        m.observe(o)
    assert [f.kind for f in m.observe(obs(21, loss=5.0))] == ["loss_spike"]
    assert [f.kind for f in m.observe(obs(22, loss=5.0))] == ["loss_spike"]


def test_plateau_is_reported_once_per_window():
    m = Monitor(MonitorConfig(window=20, min_history=10, plateau_steps=30, plateau_min_improvement=0.01))
    kinds = []
    for step in range(1, 100):
        kinds += [(step, f.kind) for f in m.observe(obs(step, loss=3.0 if step > 5 else 5.0 - 0.3 * step))]
    # best loss 3.0 is reached at step 6; no 1% improvement follows
    assert kinds == [(36, "loss_plateau"), (66, "loss_plateau"), (96, "loss_plateau")]


@pytest.mark.parametrize("history", [[], steady()], ids=["no history", "full history"])
def test_gpu_conditions_are_reported_when_they_start_not_every_step(history):
    m = Monitor(CFG)
    for o in history:
        m.observe(o)
    hot = {"temperature_c": 90.0, "util_pct": 99.0}
    n = len(history)
    assert [f.kind for f in m.observe(obs(n + 1, gpu=hot))] == ["gpu_hot"]
    assert m.observe(obs(n + 2, gpu=hot)) == []
    assert m.observe(obs(n + 3, gpu={"temperature_c": 70.0, "util_pct": 99.0})) == []
    assert [f.kind for f in m.observe(obs(n + 4, gpu=hot))] == ["gpu_hot"]


def test_findings_carry_their_evidence():
    m = Monitor(CFG)
    for o in steady():
        m.observe(o)
    (spike,) = m.observe(obs(21, loss=4.0))
    assert spike.evidence["loss"] == 4.0 and spike.evidence["threshold"] < 4.0
    assert math.isclose(spike.evidence["median"], 2.01)
    assert "step 21" in spike.message


@pytest.mark.parametrize(
    "recent, expected",
    [([], 900.0), ([0.1] * 10, 300.0), ([20.0, 20.0, 30.0], 400.0)],
)
def test_hang_timeout_derives_from_step_time_with_a_floor(recent, expected):
    assert hang_timeout_s(recent, MonitorConfig()) == expected


@pytest.mark.parametrize("history", [[], steady()], ids=["no history", "full history"])
def test_slow_rank_is_reported_when_it_starts_not_every_step(history):
    m = Monitor(CFG)
    for o in history:
        m.observe(o)
    pattern = [(0.1, 0.3)] * 4 + [(0.1, 0.1)] + [(0.1, 0.3)] * 2 + [(0.3, 0.1)] * 3
    slow = [[f.kind for f in m.observe(obs(i, ranks=r))] for i, r in enumerate(pattern, start=len(history) + 1)]
    # 3 slow steps in a row, once; a break resets; 2 are not enough; another rank starts its own count
    assert slow == [[], [], ["slow_rank"], [], [], [], [], [], [], ["slow_rank"]]


def test_millisecond_jitter_is_not_a_slow_rank():
    m = Monitor(CFG)
    assert [f.kind for i in range(1, 6) for f in m.observe(obs(i, ranks=(0.003, 0.009)))] == []


LEAK = MonitorConfig(window=20, min_history=10, plateau_steps=0, leak_window=10, leak_mb_per_step=1.0,
                     leak_min_growth_mb=50.0)


def leak_findings(rss_by_step):
    m = Monitor(LEAK)
    return [f for step, rss in rss_by_step for f in m.observe(dataclasses.replace(obs(step), rss_mb=rss))]


@pytest.mark.parametrize("rss, found", [
    ([(s, 500 + 2.0 * s) for s in range(10, 110, 10)], 1),  # 2 MB/step, 180 MB over the window
    ([(s, 500 + 2.0 * s + (40 if s % 20 else 0)) for s in range(10, 110, 10)], 1),  # noisy, still rising
    ([(s, 500 + 0.5 * s) for s in range(10, 110, 10)], 0),  # slower than the threshold
    ([(s, 500 + 2.0 * s) for s in range(1, 11)], 0),  # fast, but 18 MB in all: under the minimum growth
    # start-up: a steep ramp, then flat; and a plateau broken by a few jumps (allocator arenas)
    ([(10, 300), (20, 400), (30, 500)] + [(s, 520) for s in range(40, 110, 10)], 0),
    ([(s, 500 + (300 if s in (50, 80) else 0)) for s in range(10, 110, 10)], 0),
    ([(s, 500.0) for s in range(10, 100, 10)], 0),  # not a full window yet
])
def test_a_leak_is_resident_memory_rising_steadily_over_the_window(rss, found):
    assert len(leak_findings(rss)) == found


def test_a_leak_is_reported_with_its_slope_once_per_window_and_as_the_ranks_own():
    rising = [(s, 500 + 2.0 * s) for s in range(10, 310, 10)]
    findings = leak_findings(rising)
    assert [f.step for f in findings] == [100, 200, 300]
    f = findings[0]
    assert f.kind == "memory_leak" and f.local
    assert math.isclose(f.evidence["mb_per_step"], 2.0) and math.isclose(f.evidence["growth_mb"], 180.0)
    assert (f.evidence["first_step"], f.evidence["last_step"], f.evidence["samples"]) == (10, 100, 10)
    assert "2.00 MB/step over steps 10-100: 520 -> 700 MB" in f.message
    # steps that did not read memory (rss_mb None) leave the window alone
    m = Monitor(LEAK)
    assert [f for s in range(1, 101) for f in m.observe(obs(s))] == []
