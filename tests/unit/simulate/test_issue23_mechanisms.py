"""Issue 23's mechanisms in the simulator: which faults let the survivors restart in their own
processes, the memory tier's copies, and what each mechanism costs or saves in a run."""

from dataclasses import replace

import pytest

from resilient_slurm.ledger import Kind
from resilient_slurm.simulate import costs
from resilient_slurm.simulate.engine import Run
from resilient_slurm.simulate.failures import FAULTS, Fault, survivors_trusted
from resilient_slurm.simulate.history import Ledger
from resilient_slurm.simulate.memory import MemorySave, MemoryTier
from resilient_slurm.simulate.results import outcome
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario

SMALL = Scenario(gpus=800, days=2, gpu_mtbf_h=800 * 2.0, spares=8)  # 100 nodes, a failure every 2 h
CRASH = Fault("crash", "software", 1.0, "RuntimeError: DataLoader worker exited unexpectedly")
HANG = Fault("hang", "network", 1.0, "no step completed for 300 s (collective stuck)", hang=True)
DOWN = Fault("down", "host", 1.0, "srun: error: node not responding", node_down=True)


@pytest.mark.parametrize("name, trusted, why", [
    ("gpu-reset", False, "CUDA error"), ("gpu-replace", False, "hang"), ("net-transient", False, "hang"),
    ("gpu-sdc", True, ""), ("net-link", True, ""), ("host-down", True, ""), ("sw-crash", True, ""),
    ("sw-code-bug", True, ""),
])
def test_which_faults_leave_the_survivors_processes_sound(name, trusted, why):
    fault = next(f for f in FAULTS if f.name == name)
    assert survivors_trusted(fault) == (trusted, why)


def test_the_in_process_share_of_the_published_mix_is_three_in_ten():
    share = sum(f.weight for f in FAULTS if survivors_trusted(f)[0]) / sum(f.weight for f in FAULTS)
    assert share == pytest.approx(0.2996, abs=1e-4)


@pytest.mark.parametrize("lost, complete", [
    (set(), True),
    ({"a"}, True),  # b holds a's copy
    ({"a", "c"}, True),  # b and d hold theirs
    ({"a", "b"}, False),  # a's copy was on b
    ({"d", "a"}, False),  # the ring wraps: d's copy is on a
])
def test_a_memory_save_is_complete_unless_a_node_and_its_buddy_are_both_gone(lost, complete):
    assert MemorySave(1.0, 1, ("a", "b", "c", "d"), set(lost)).complete() is complete


def test_the_memory_tier_keeps_one_save_in_flight_and_loses_it_with_the_step():
    tier = MemoryTier(every_s=0.0, blocking_s=0.1, save_s=2.0, step_s=1.0, max_s=3600.0)
    tier.resume(0.0, 0, mtbf_s=3600.0)
    assert tier.due_at == pytest.approx((2 * 0.1 * 3600) ** 0.5)  # Young-Daly on its own cost
    assert tier.take(10.0, 10.0, 10, ("a", "b")) == pytest.approx(10.1)
    assert tier.busy_until(11.0, blocked_until=10.1) == 12.0  # the one in flight commits at 12
    assert tier.commit().step == 10 and tier.usable().step == 10
    tier.take(20.0, 20.0, 20, ("a", "b"))
    tier.lose({"a"})  # a failure: the save in flight dies, the committed one is on b too
    assert tier.pending is None and tier.usable().step == 10
    tier.lose({"b"})
    assert tier.usable() is None
    tier.clear()
    assert tier.newest is None and tier.due_at == float("inf")


@pytest.mark.parametrize("fault, replaced, path, causes", [
    (CRASH, False, "in process", {"placement": 0.5, "teardown": 11.5, "startup": 0.0, "rendezvous": 0.5}),
    (DOWN, True, "in process", {"placement": 0.5, "teardown": 11.5, "startup": 0.0, "rendezvous": 0.5}),
    (HANG, True, "step restart (hang)", {"startup": 30.0}),
    (FAULTS[0], True, "step restart (CUDA error)", {"startup": 30.0}),
])
def test_a_restart_inside_the_allocation_is_broken_down_by_its_path(fault, replaced, path, causes):
    name, before, after = costs.restart_path(Scenario(), STRATEGIES["inprocess"], fault, replaced)
    assert name == path and dict(before) == causes
    assert dict(after) == ({"data_ready": 0.0, "first_step": 0.0} if name == "in process" else {})
    slow = replace(Scenario(), replacement_start_s=20.0)  # a start the teardown does not hide
    if name == "in process" and replaced:
        assert dict(costs.restart_path(slow, STRATEGIES["inprocess"], fault, True)[1])["startup"] == 8.5


def run(strategy, faults, **changes):
    s = replace(SMALL, faults=faults, **changes)
    return Run(s, STRATEGIES[strategy], seed=0, ledger=Ledger(keep_full=True)).run()


def test_heartbeats_find_a_hang_after_heartbeat_s_instead_of_the_collective_timeout():
    before, after = run("spares", (HANG,)), run("heartbeat", (HANG,))
    for r, waited in ((before, 300.0), (after, 6.0)):
        hangs = [e for e in r.ledger.full if e.kind is Kind.HANG]
        assert hangs and {e.details.waited_s for e in hangs} == {waited}
        assert r.lost["detect"] == pytest.approx(len(hangs) * waited)


def test_a_restart_in_place_loads_from_the_nodes_memory_and_a_lost_node_from_its_buddy():
    crash, down = run("memory", (CRASH,)), run("memory", (DOWN,))
    for r, buddy in ((crash, False), (down, True)):
        # the disk only before the first memory-tier save of the run has committed
        first = next(e.time for e in r.ledger.full if e.kind is Kind.SAVE and e.details.mode == "memory")
        early = sum(1 for e in r.ledger.full if e.kind is Kind.START and e.restart and e.time < first)
        restarts = r.restarts["in place"] + r.restarts["spare"] - early
        requeued = r.restarts["requeue, out of spares"]
        assert restarts > 5 and r.disk_restarts == early + requeued
        assert r.lost["load"] == pytest.approx((early + requeued) * r.s.load_s)
        assert r.lost["load_memory"] == pytest.approx(restarts * r.s.memory_load_s)
        assert r.lost["load_buddy"] == pytest.approx(restarts * (r.s.buddy_load_s - r.s.memory_load_s) * buddy)
    saves = [e for e in crash.ledger.full if e.kind is Kind.SAVE and e.details.mode == "memory"]
    assert len(saves) == crash.memory.saves > 100


def test_without_spares_a_requeue_empties_the_memory_tier_and_the_disk_is_read():
    r = run("memory", (DOWN,), spares=0)
    assert r.restarts["requeue, out of spares"] > 5 and r.lost["load_memory"] == 0.0
    assert r.lost["load"] == pytest.approx(r.restarts["requeue, out of spares"] * r.s.load_s)
    assert r.disk_restarts == r.restarts["requeue, out of spares"]


def test_the_memory_tier_cuts_the_work_redone():
    before, after = run("heartbeat", (CRASH,)), run("memory", (CRASH,))
    assert after.lost["redone"] < 0.7 * before.lost["redone"]
    assert after.lost["memory_checkpoint"] > 0 and after.lost["checkpoint"] < before.lost["checkpoint"]


def test_survivors_restart_in_process_after_a_crash_and_take_a_step_restart_after_a_hang():
    crash, hang = run("inprocess", (CRASH,)), run("inprocess", (HANG,))
    n = crash.restarts["in place"]
    assert crash.paths == {"in process": n} and n > 5
    assert crash.lost["startup"] == 0.0  # nobody starts a process
    assert crash.lost["teardown"] == pytest.approx(n * crash.s.teardown_s)
    m = sum(hang.restarts.values()) - hang.restarts.get("requeue, out of spares", 0)
    assert hang.paths == {"step restart (hang)": m} and hang.lost["teardown"] == 0.0
    assert hang.lost["startup"] >= m * hang.s.in_alloc_restart_s


@pytest.mark.parametrize("name", ["spares", "inprocess"])
def test_ettr_is_the_surviving_work_over_the_wall_time_and_goodput_charges_the_spares(name):
    r = run(name, FAULTS)
    o = outcome(r, 0)
    s = SMALL
    assert o.ettr == pytest.approx(o.productive_gpu_h / (s.gpus * s.horizon_s / 3600))
    # A spare is paid while it is held idle: one that took a failed node's place is one of the job's
    # GPUs from then on (the failed node left the job), so less than every spare for the whole window.
    every_spare = s.spares * s.gpus_per_node * s.horizon_s / 3600
    assert r.restarts["spare"] > 0 and 0 < o.lost_gpu_h["spares"] < every_spare
    assert o.paid_gpu_h == pytest.approx(o.job_gpu_h + o.lost_gpu_h["spares"])
    assert o.goodput == pytest.approx(o.ettr * o.job_gpu_h / o.paid_gpu_h)
    job_losses = sum(v for k, v in o.lost_gpu_h.items() if k != "spares")
    assert 1 - o.ettr == pytest.approx(job_losses / o.job_gpu_h)


def test_memory_tier_saves_are_progress_and_the_window_still_decides_as_the_whole_ledger(monkeypatch):
    """A memory-tier save counts as progress for the restart budget (it is one), so the windowed
    ledger must keep deciding exactly as the whole one does once those saves are in it."""
    from resilient_slurm import recovery

    decide = recovery.decide
    ledger = Ledger(keep_full=True)
    checked = []

    def decide_both(code, signal, error, history, budget):
        d = decide(code, signal, error, history, budget)
        assert d == decide(code, signal, error, ledger.full, budget)
        checked.append(d.action)
        return d

    monkeypatch.setattr(recovery, "decide", decide_both)
    s = replace(SMALL, days=3, gpu_mtbf_h=800 * 1.0, planned_per_day=2.0, max_restarts=2)
    run = Run(s, STRATEGIES["inprocess"], seed=2, ledger=ledger).run()
    assert len(checked) > 50 and run.memory.saves > 500
    assert run.paths["in process"] and run.paths["step restart (hang)"] and run.restarts["planned stop"]
