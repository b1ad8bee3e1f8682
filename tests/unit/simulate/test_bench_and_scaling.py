"""The keys the simulator reads from bench/checkpoint.py --json and bench/restart.py --json, and the
rules that scale them from this machine to an 8B model on H100 nodes."""

import math

import pytest

from resilient_slurm.simulate import bench, scaling
from resilient_slurm.simulate.scenario import Scenario, from_bench

STEP = {"step_teardown_s": 1.0, "step_placement_s": 0.2, "step_process_start_s": 5.0, "step_rendezvous_s": 0.3,
        "step_data_ready_s": 0.4, "step_first_step_s": 0.9, "step_detect_s": 0.5, "step_load_s": 2.0}
INPROCESS = {"inprocess_teardown_s": 0.6, "inprocess_placement_s": 0.2, "inprocess_process_start_s": 4.0,
             "inprocess_rendezvous_s": 0.1, "inprocess_data_ready_s": 0.05, "inprocess_first_step_s": 0.7}


@pytest.mark.parametrize("raw, fields", [
    # an old bench/checkpoint.py file still works: lost_s wins over blocking_s
    ({"save_s": 3, "blocking_s": 0.1, "lost_s": 0.2, "load_s": 4, "bytes": 2e9, "note": "x"},
     {"save_s": 3.0, "blocking_s": 0.2, "load_s": 4.0, "ckpt_bytes": 2e9}),
    ({"memory_blocking_s": 0.05, "memory_save_s": 0.4, "memory_load_s": 0.3, "buddy_load_s": 0.6},
     {"memory_blocking_s": 0.05, "memory_save_s": 0.4, "memory_load_s": 0.3, "buddy_load_s": 0.6}),
    ({"heartbeat_detect_s": 31.0, "collective_detect_s": 61.0, "crash_detect_s": 0.8, "heartbeat_timeout_s": 30},
     {"heartbeat_s": 31.0, "hang_detect_s": 61.0, "crash_detect_s": 0.8}),
    # the step path's parts from teardown to first step, less a steady step: detect and load are their own
    ({**STEP, "steady_step_s": 0.1}, {"in_alloc_restart_s": pytest.approx(1.0 + 0.2 + 5.0 + 0.3 + 0.4 + 0.9 - 0.1)}),
    ({**INPROCESS, "steady_step_s": 0.1},
     {"teardown_s": 0.6, "placement_s": 0.2, "replacement_start_s": 4.0, "rendezvous_s": 0.1, "data_ready_s": 0.05,
      "first_step_s": pytest.approx(0.6)}),
    ({"requeue_process_start_s": 6.0, "requeue_rendezvous_s": 0.3, "requeue_data_ready_s": 0.4,
      "requeue_first_step_s": 0.5, "requeue_detect_s": 9.0, "steady_step_s": 0.5}, {"restart_s": pytest.approx(6.7)}),
], ids=["old checkpoint file", "memory tier", "detection", "step restart", "in-process restart", "requeue"])
def test_bench_keys_become_scenario_fields(raw, fields):
    assert from_bench(raw, "f") == fields
    Scenario(**from_bench(raw, "f"))  # every field it names exists


@pytest.mark.parametrize("raw, message", [
    ({"step_teardown_s": 1.0, "steady_step_s": 0.1}, "in_alloc_restart_s needs step_placement_s"),
    ({**INPROCESS}, "first_step_s needs steady_step_s"),
    ({"ranks": 2, "steady_step_s": 0.1}, "none of save_s"),
    ({"memory_load_s": "fast"}, "memory_load_s='fast' is not a non-negative number"),
    ([1, 2], "not a JSON object"),
])
def test_bench_files_that_cannot_be_read_say_why(raw, message):
    with pytest.raises(ValueError, match=message):
        from_bench(raw, "f")


def test_the_8b_h100_profile_holds_an_8b_models_state_sharded_over_every_gpu():
    profile = scaling.PROFILES["8b-h100"]
    assert profile.bytes_per_rank(10_000) == pytest.approx(8.03e9 * 12 / 10_000)  # 9.6 MB
    assert profile.machine.network == 50e9 and profile.machine.host_link == 64e9


MB = 1e6
TARGET = scaling.PROFILES["8b-h100"]
PER_RANK = TARGET.bytes_per_rank(10_000)
TIMEOUTS = {"heartbeat_timeout_s": 30.0, "collective_timeout_s": 300.0}


@pytest.mark.parametrize("key, values, expected", [
    # bytes: what the medium's speed here does not explain stays as a fixed cost; the bytes there
    # move at the target's speed
    ("memory_blocking_s", {"memory_blocking_s": 0.1, "bytes": 550 * MB},
     0.1 - 550 * MB / scaling.HERE.host_link + PER_RANK / TARGET.machine.host_link),
    ("memory_blocking_s", {"memory_blocking_s": 0.1, "bytes": 4e9, "memory_bytes": 110 * MB},
     0.1 - 110 * MB / scaling.HERE.host_link + PER_RANK / TARGET.machine.host_link),
    ("buddy_load_s", {"buddy_load_s": 0.02, "bytes": 1100 * MB},  # faster than the medium here: no fixed part
     PER_RANK / TARGET.machine.network),
    ("save_s", {"save_s": 3.0, "bytes": 1.1e9}, 2.0 + PER_RANK / TARGET.machine.disk_write),
    ("load_s", {"load_s": 3.0, "bytes": 0.7e9}, 2.0 + PER_RANK / TARGET.machine.disk_read),
    # ranks: log2 of the world size, never below NVRx's figure at its scale
    ("inprocess_rendezvous_s", {"inprocess_rendezvous_s": 0.2, "ranks": 2}, 0.2 * math.log2(10_000)),
    ("inprocess_rendezvous_s", {"inprocess_rendezvous_s": 0.001, "ranks": 2}, 0.5 * math.log2(10_000) / 14),
    ("step_first_step_s", {"step_first_step_s": 0.3, "ranks": 4}, 0.3 * math.log2(10_000) / 2),
    # timeout: the target's timeout, plus what the bench took beyond its own
    ("heartbeat_detect_s", {"heartbeat_detect_s": 12.5, "heartbeat_timeout_s": 10.0}, 32.5),
    ("collective_detect_s", {"collective_detect_s": 61.0, "collective_timeout_s": 60.0}, 301.0),
    # one node's or one rank's work: as measured
    ("inprocess_process_start_s", {"inprocess_process_start_s": 4.2, "ranks": 2}, 4.2),
    ("crash_detect_s", {"crash_detect_s": 0.7}, 0.7),
    ("bytes", {"bytes": 2e9, "save_s": 1.0}, PER_RANK),
])
def test_each_rule_scales_a_measured_cost(key, values, expected):
    out, how = scaling.scale(values, TARGET, 10_000, TIMEOUTS, "f")
    assert out[key] == pytest.approx(expected) and how[key]


@pytest.mark.parametrize("values, message", [
    ({"memory_load_s": 0.1}, "gives memory_load_s but not the bytes it moved"),
    ({"inprocess_teardown_s": 0.1}, "gives inprocess_teardown_s but not the ranks it ran"),
    ({"heartbeat_detect_s": 31.0}, "gives heartbeat_detect_s but not heartbeat_timeout_s"),
])
def test_scaling_refuses_a_cost_without_what_its_rule_needs(values, message):
    with pytest.raises(ValueError, match=message):
        scaling.scale(values, TARGET, 10_000, TIMEOUTS, "f")


def test_an_async_saves_blocking_part_is_never_scaled_past_the_whole_save():
    # the save here outran the disk's figure (page cache): its bytes explain all of it, while the
    # blocked-and-slowed time keeps a fixed part
    values = {"save_s": 0.54, "lost_s": 0.28, "blocking_s": 0.12, "bytes": 1.09e9}
    out, how = scaling.scale(values, TARGET, 10_000, TIMEOUTS, "f")
    assert out["save_s"] == pytest.approx(PER_RANK / TARGET.machine.disk_write)
    assert out["lost_s"] == out["blocking_s"] == out["save_s"] and "at most the whole save" in how["lost_s"]


def test_a_restart_scaled_part_by_part_keeps_its_extra_over_a_steady_step():
    """The step path's total is summed after each part is scaled; the steady step it subtracts is
    scaled like the first step, so the first step's extra grows by the ranks rule only."""
    values = {**STEP, "steady_step_s": 0.1, "ranks": 2}
    out, _ = scaling.scale(values, TARGET, 10_000, TIMEOUTS, "f")
    factor = math.log2(10_000)
    teardown = max(1.0 * factor, 0.5 * factor / 14)
    expected = teardown + 0.2 + 5.0 + 0.3 * factor + 0.4 + (0.9 - 0.1) * factor
    assert bench.to_fields(out, "f")["in_alloc_restart_s"] == pytest.approx(expected)


def test_every_bench_key_has_a_rule_and_every_rule_is_documented():
    doc = scaling.__doc__ or ""
    for key in bench.BENCH_KEYS:
        assert scaling.rule(key) in ("bytes", "ranks", "timeout", "same")
        if scaling.rule(key) == "bytes":
            assert key in doc
    breakdown = {f"{path}_{part}_s" for path in bench.PATHS for part in bench.PARTS}
    for key in bench.BENCH_KEYS:
        assert key in (bench.__doc__ or "") or key in breakdown, key
