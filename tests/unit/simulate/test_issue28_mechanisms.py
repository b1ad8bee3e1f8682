"""Issue 28 in the simulator: replica groups that leave and heal, silent data corruption, stragglers,
communicator creation, and the costs bench/replica.py will measure."""

from dataclasses import replace

import pytest

from resilient_slurm.simulate import costs, published
from resilient_slurm.simulate.bench import from_bench
from resilient_slurm.simulate.engine import Run
from resilient_slurm.simulate.failures import Fault
from resilient_slurm.simulate.results import outcome
from resilient_slurm.simulate.scaling import PROFILES, scale
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario, Strategy

QUIET = dict(sdc_gpu_mtbf_h=0.0, straggler_gpu_mtbf_h=0.0)
SMALL = Scenario(gpus=800, days=2, gpu_mtbf_h=800 * 2.0, spares=8, replica_groups=4, **QUIET)
"""100 nodes in 4 groups of 25, a failure every 2 h, and nothing else going on."""
CRASH = Fault("crash", "software", 1.0, "RuntimeError: DataLoader worker exited unexpectedly")
HANG = Fault("hang", "network", 1.0, "no step completed (collective stuck)", hang=True)
CUDA = Fault("cuda", "gpu", 1.0, "RuntimeError: CUDA error: uncorrectable ECC error encountered", xid=94, xid_rst=True)
DOWN = Fault("down", "host", 1.0, "srun: error: node not responding", node_down=True)
BUG = Fault("bug", "software", 1.0, "IndexError: index 4096 is out of bounds", code_bug=True)
GROUPS = Strategy("groups", "replica groups, no saves", "none", False, True, False, heartbeat=True, in_process=True,
                  replica_ft=True)
"""Nothing blocks the loop (no saves), so every second short a group is lost to `degraded`."""


def run(s, strategy, seed=0):
    return Run(s, strategy if isinstance(strategy, Strategy) else STRATEGIES[strategy], seed).run()


def test_communicator_creation_scales_the_published_figures_linearly():
    assert published.comm_init_s(96_000) == pytest.approx(26.0 + 22.0)
    assert published.comm_init_s(10_000) == pytest.approx(5.0, abs=0.01)
    s = Scenario()
    assert s.value("comm_init_s") == s.comm_init() == pytest.approx(5.0, abs=0.01)
    assert s.comm_init(1000) == pytest.approx(0.5, abs=0.01)
    assert replace(s, comm_init_s=20.0).comm_init(1000) == 2.0  # a given figure, scaled to a group


@pytest.mark.parametrize("fault, path, detect_s, node_away", [
    (CRASH, "in process", 0.0, False),  # the group restarts in its processes
    (HANG, "step restart (hang)", Scenario().heartbeat_s, False),  # every live GPU waits for the heartbeat
    (CUDA, "step restart (CUDA error)", 0.0, True),  # the node goes for a reset; a spare takes its place
    (DOWN, "in process", 0.0, True),
])
def test_a_failure_stops_only_its_group_which_heals_while_the_others_train_short_of_it(fault, path, detect_s,
                                                                                       node_away):
    s = replace(SMALL, faults=(fault,), spares=40)
    r = run(s, GROUPS)
    heals = r.paths[f"group heal ({fault.name})"]
    assert heals > 10 and set(r.paths) == {f"group heal ({fault.name})"} and not r.restarts
    # the group's own time out: its restart path, its communicator, the heal, a step boundary
    _, before, after = costs.restart_path(s, GROUPS, fault, replaced=node_away)
    out_s = sum(x for _, x in before + after) + s.comm_init(s.gpus // 4) + s.heal_seconds + s.step_s / 2
    assert r.lost["degraded"] == pytest.approx(heals * out_s / s.replica_groups, rel=0.02)
    assert r.lost["quorum"] == pytest.approx(2 * heals * s.quorum_s, rel=0.02)  # it leaves, it joins
    assert r.lost["detect"] == pytest.approx(heals * detect_s)
    assert r.lost["redone"] == pytest.approx(heals * s.step_s / 2)  # only the step in flight
    assert r.lost["load"] == r.lost["comm_init"] == 0.0  # nothing read, no world communicator
    assert (r.excluded["health verdict"] + len(r.dead) > 0) == node_away


@pytest.mark.parametrize("changes, fault, refusal", [
    ({}, BUG, "whole run: a code bug fails every group"),
    ({"replica_min": 4}, CRASH, "whole run: fewer than 4 live groups"),
    ({"spares": 0}, DOWN, "whole run: no spare for the group"),
])
def test_refused_failures_take_the_whole_run_restart(changes, fault, refusal):
    r = run(replace(SMALL, faults=(fault,), **changes), "replica_ft")
    assert r.paths[refusal] > 0 and sum(r.restarts.values()) > 0
    assert not any(p.startswith("group heal") for p in r.paths)


SDC_ONLY = replace(SMALL, gpu_mtbf_h=1e12, sdc_gpu_mtbf_h=800 * 6.0, sdc_nan_share=0.0, spares=40)
"""No failures; a silent data corruption every 6 h, none of which ends in NaN."""


def test_a_silent_corruption_costs_at_least_its_latency_without_the_sentinel_and_a_heal_with_it():
    blind, seen = run(SDC_ONLY, "stragglers"), run(SDC_ONLY, "sdc")
    # seen only hours later (one rollback undoes the ones since): every second since the checkpoint
    # before it is redone, then a restart loads that checkpoint from the cold tier
    found = blind.interruptions["sdc (found late: rolled back)"]
    assert blind.interruptions["sdc (silent)"] >= found > 3
    assert blind.lost["sdc"] >= found * (SDC_ONLY.sdc_found_after_h * 3600.0 + SDC_ONLY.cold_load_s)
    caught = seen.interruptions["sdc (caught by the sentinel)"]
    assert caught > 3 and seen.paths["group heal (sdc)"] == caught and seen.lost["sdc"] == 0.0
    assert seen.lost["sentinel"] > 0 and outcome(seen, 0).goodput > outcome(blind, 0).goodput


def test_a_corruption_that_ends_in_nan_is_rolled_back_at_once():
    r = run(replace(SDC_ONLY, sdc_nan_share=1.0), "sdc")
    n = r.interruptions["sdc (NaN: rolled back)"]
    assert n > 3 and r.sdc_pending is None
    # back to the newest memory-tier or disk checkpoint: at most a save interval each, plus the load
    assert r.lost["sdc"] < n * (SMALL.max_interval_s + SMALL.load_s)


STRAGGLERS_ONLY = replace(SMALL, gpu_mtbf_h=1e12, straggler_gpu_mtbf_h=800 * 3.0, spares=40)


def test_a_straggler_slows_the_whole_run_until_it_ends_or_is_swapped_out():
    slow, swapped = run(STRAGGLERS_ONLY, "replica_ft"), run(STRAGGLERS_ONLY, "stragglers")
    s = STRAGGLERS_ONLY
    episodes = slow.interruptions["straggler"]
    per = (1 - 1 / s.straggler_slowdown) * s.straggler_duration_h * 3600.0
    assert episodes > 5 and slow.lost["straggler"] == pytest.approx(episodes * per, rel=0.5)
    n = swapped.paths["group heal (straggler)"]
    assert n > 5 and swapped.lost["straggler"] <= n * s.straggler_detect_s * (1 - 1 / s.straggler_slowdown) * 1.01
    assert swapped.lost["straggler"] < slow.lost["straggler"] / 5


def test_the_speed_losses_add_up_to_what_the_run_lost():
    o = outcome(run(replace(Scenario(gpus=800, days=3, gpu_mtbf_h=800 * 2.0), sdc_gpu_mtbf_h=800 * 10.0,
                            straggler_gpu_mtbf_h=800 * 5.0), "sdc"), 0)
    job = {c: v for c, v in o.lost_gpu_h.items() if c != "spares"}
    assert 1 - o.ettr == pytest.approx(sum(job.values()) / o.job_gpu_h)
    assert o.lost_gpu_h["degraded"] > 0 and o.lost_gpu_h["straggler"] > 0 and o.lost_gpu_h["sentinel"] > 0


def test_bench_replica_keys_become_the_scenarios_costs():
    raw = {"replica_groups": 2, "steady_step_s": 0.5, "short_step_s": 1.1, "quorum_s": 0.3, "heal_s": 2.5,
           "heal_bytes": 2e8, "fingerprint_s": 0.004, "straggler_found_s": 12.0, "hang_culprit_s": 8.0}
    fields = from_bench(raw, "r.json")
    assert fields == {"degraded_overhead": pytest.approx(1.1), "quorum_s": 0.3, "heal_s": 2.5, "fingerprint_s": 0.004,
                      "straggler_detect_s": 12.0}
    Scenario(**fields)
    with pytest.raises(ValueError, match="short_step_s needs"):
        from_bench({"short_step_s": 1.0, "steady_step_s": 0.5}, "r.json")
    # at 10,000 GPUs in 10 groups: a heal moves a group's GPU's share of the 8B model's state
    scaled, how = scale(raw | {"bytes": 2e8, "ranks": 4}, PROFILES["8b-h100"], 10_000, {}, "r.json", groups=10)
    share = 8.03e9 * 12 / 10_000 * 10
    assert scaled["heal_s"] == pytest.approx(2.5 - 2e8 / 11e9 + share / 50e9)
    assert scaled["fingerprint_s"] == pytest.approx(share / 3350e9)  # the CPU's memory speed explains all 4 ms
    assert scaled["quorum_s"] == 0.3 and "fixed" in how["heal_s"]


def test_bad_replica_inputs_are_refused_with_one_line():
    assert Scenario(replica_groups=4, replica_min=5).validate() == ["--replica-min 5: must be between 1 and "
                                                                    "--replica-groups 4"]
    assert Scenario(straggler_slowdown=0.9).validate() == ["--straggler-slowdown: must be >= 1 (1: no slower than "
                                                           "ideal)"]
    assert Scenario(sdc_nan_share=2).validate() == ["--sdc-nan-share: must be between 0 and 1"]


TOPUP = replace(GROUPS, name="topup", topup=True)


def test_without_a_spare_a_group_waits_out_for_a_topup_instead_of_the_whole_run_requeueing():
    s = replace(SMALL, faults=(DOWN,), spares=0, topup_nodes=1, queue_min_s=300.0, queue_max_s=300.0)
    without, topped = run(s, GROUPS), run(s, TOPUP)
    assert without.paths["whole run: no spare for the group"] > 0 and without.restarts["requeue, out of spares"] > 0
    heals = topped.paths["group heal (down)"]
    assert heals > 10 and not topped.restarts and topped.lost["queue"] == 0.0 and len(topped.dead) == heals
    # Asked for whenever none is left: at the first loss, then each time a lent node is taken.
    assert topped.paths["spare top-up asked"] in (heals, heals + 1)
    # The first group waits out the 300 s queue wait on top of its path, its communicator, the heal
    # and a step boundary; later ones find the node the last top-up brought, as with a spare.
    _, before, after = costs.restart_path(s, TOPUP, DOWN, replaced=True)
    out_s = sum(x for _, x in before + after) + s.comm_init(s.gpus // 4) + s.heal_seconds + s.step_s / 2
    assert topped.lost["degraded"] >= (heals * out_s + 300.0) / s.replica_groups * 0.98
    assert topped.lost["degraded"] < heals * (out_s + 300.0) / s.replica_groups
    # A lent node is paid for while it waits idle for the next loss: never more than one here.
    spare = outcome(topped, 0).lost_gpu_h["spares"]
    assert 0 < spare < s.gpus_per_node * s.horizon_s / 3600
    assert outcome(topped, 0).goodput > outcome(without, 0).goodput


def test_a_restart_of_the_whole_run_gives_the_lent_nodes_back():
    s = replace(SMALL, faults=(DOWN, replace(BUG, weight=0.2)), spares=0, topup_nodes=1)
    r = run(s, TOPUP)
    assert r.paths["whole run: a code bug fails every group"] > 0 and r.paths["spare top-up asked"] > 0
    # Its start is one step of the job's own per group: with the lent nodes gone and no spare of
    # its own, it requeues.
    assert r.restarts["requeue, out of spares"] > 0 and r.restarts.get("spare", 0) == 0


def test_asking_before_the_spares_run_out_spares_the_groups_the_wait():
    """cluster.spare_topup_at: with a spare still left when a top-up is asked for, a group lost
    meanwhile takes that spare instead of waiting out the queue (an hour here, a failure every 2 h):
    asked only once none is left, two groups waited out at once, too few trained on, and the whole
    run restarted and requeued."""
    s = replace(SMALL, faults=(DOWN,), spares=1, topup_nodes=1, queue_min_s=3600.0, queue_max_s=3600.0)
    late, early = run(s, TOPUP), run(replace(s, topup_at=1), TOPUP)
    assert late.paths["whole run: fewer than 3 live groups"] > 0 and late.restarts["requeue, out of spares"] > 0
    assert not early.restarts and early.paths["spare top-up asked"] > late.paths["spare top-up asked"]
    assert outcome(early, 0).goodput > outcome(late, 0).goodput
