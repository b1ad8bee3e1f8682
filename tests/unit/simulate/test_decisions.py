"""The simulated run's decisions are the project's: the crash-loop guard, the node classification,
the health verdict, the placement inside the allocation; and the windowed ledger they read
decides exactly as the whole ledger would."""

from dataclasses import replace

import pytest

from resilient_slurm import recovery
from resilient_slurm.checkpoint import costs as checkpoint_costs
from resilient_slurm.checkpoint.interval import failure_history
from resilient_slurm.ledger import Kind
from resilient_slurm.simulate import engine
from resilient_slurm.simulate.engine import Run
from resilient_slurm.simulate.failures import FAULTS, Fault
from resilient_slurm.simulate.history import EPOCH, Ledger
from resilient_slurm.simulate.results import outcome
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario

SMALL = Scenario(gpus=800, days=3, gpu_mtbf_h=800 * 3.0)  # 100 nodes, a failure every 3 h


def events(run, kind):
    return [e for e in run.ledger.full if e.kind is Kind(kind)]


def test_a_code_bug_makes_the_run_give_up_through_the_crash_loop_guard():
    bug = Fault("bug", "software", 1.0, "IndexError: index 4096 is out of bounds", code_bug=True)
    # A budget far beyond reach: only the guard (same failure, same step, several nodes) can stop it.
    s = replace(SMALL, faults=(bug,), gpu_mtbf_h=800 * 12.0, max_restarts=100)
    run = Run(s, STRATEGIES["young_daly"], seed=1, ledger=Ledger(keep_full=True)).run()
    gave_up = events(run, "gave_up")
    assert gave_up and run.restarts["gave up"] == len(gave_up)
    assert all("code bug" in e.details.reason and "a restart will not fix it" in e.details.reason for e in gave_up)
    first = run.ledger.full.index(gave_up[0])
    crashes = [e for e in run.ledger.full[:first] if e.kind is Kind.CRASH and e.details.error == bug.error]
    assert crashes[-1].step == crashes[-2].step and crashes[-1].node != crashes[-2].node


def test_a_node_that_fails_again_soon_is_excluded_by_the_crash_loop_guard():
    flaky = Fault("flaky", "network", 1.0, "RuntimeError: link flapped", recur_h=0.01)
    s = replace(SMALL, faults=(flaky,), days=0.9)  # within the exclude list's 24 h
    run = Run(s, STRATEGIES["young_daly"], seed=0, ledger=Ledger(keep_full=True)).run()
    pinned = [e for e in events(run, "requeue") if e.details.exclude and "failures follow node" in e.details.reason]
    assert pinned and run.excluded["crash-loop guard"] == len(pinned)
    for e in pinned:
        node = e.details.exclude[0]
        assert node in run.exclude  # the exclude list the requeue wrote
        assert node not in run.alloc.in_use and node not in run.process.latent


@pytest.mark.parametrize("xid, rst, action", [(79, None, "drain"), (94, True, "reset-gpu")])
def test_the_health_verdict_takes_the_node_out(xid, rst, action):
    fault = Fault("xid", "gpu", 1.0, "RuntimeError: CUDA error", xid=xid, xid_rst=rst)
    s = replace(SMALL, faults=(fault,), spares=4)
    run = Run(s, STRATEGIES["spares"], seed=0, ledger=Ledger(keep_full=True)).run()
    unhealthy = events(run, "node_unhealthy")
    assert unhealthy and {e.details.action for e in unhealthy} == {action}
    restarts = events(run, "restart_in_allocation")
    assert restarts and all(e.details.added for e in restarts)  # a spare took the node's place
    bad = {e.details.bad_node for e in unhealthy}
    if action == "drain":
        assert not bad & (set(run.alloc.in_use) | set(run.alloc.spares))  # never chosen again
    else:
        assert bad & (set(run.alloc.in_use) | set(run.alloc.spares))  # back after its reset


def test_without_spares_the_elastic_run_shrinks_and_the_other_requeues():
    fault = Fault("dead", "host", 1.0, "srun: error: node not responding", node_down=True)
    s = replace(SMALL, faults=(fault,), spares=0, min_nodes=90)
    elastic = Run(s, STRATEGIES["elastic"], seed=0).run()
    spares = Run(s, STRATEGIES["spares"], seed=0).run()
    assert elastic.restarts["shrink"] > 0 and len(elastic.alloc.in_use) < s.nodes
    assert spares.restarts["requeue, out of spares"] > 0 and "shrink" not in spares.restarts


PAIRS = (Fault("link", "network", 1.0, "RuntimeError: ibv_poll_cq: transport retry counter exceeded", recur_h=0.0),
         Fault("bug", "software", 0.5, "IndexError: index 4096 is out of bounds", code_bug=True),
         Fault("crash", "software", 2.0, "RuntimeError: DataLoader worker exited unexpectedly"))
"""Mostly the pairs `recovery.across_progress` reads across a checkpoint: dead links, code bugs."""


@pytest.mark.parametrize("faults, seed", [(FAULTS, 3), (PAIRS, 4)], ids=["published mix", "pairs across progress"])
def test_the_window_decides_as_the_whole_ledger_would(monkeypatch, faults, seed):
    """Every decision of a run with node faults, hangs, code bugs and recurring nodes is taken
    again on the full ledger: same decision, same failure count and exposure, same save costs."""
    decide, mtbf, save_costs, pair = recovery.decide, engine.mtbf_s, engine.save_costs, recovery.across_progress
    checked = {"decide": 0, "mtbf": 0, "costs": 0, "node": 0, "code_bug": 0}
    ledger = Ledger(keep_full=True)
    holder: dict[str, Run] = {}

    def decide_both(code, signal, error, history, budget):
        d = decide(code, signal, error, history, budget)
        assert d == decide(code, signal, error, ledger.full, budget)
        checked["decide"] += 1
        return d

    def mtbf_both(history, prior_s):
        full = failure_history(ledger.full, EPOCH.timestamp() + holder["run"].t)
        assert history.failures == full.failures
        assert history.exposure_s == pytest.approx(full.exposure_s, abs=0.002 * (full.failures + 1))
        checked["mtbf"] += 1
        return mtbf(history, prior_s)

    def costs_both(recent):
        assert save_costs(recent) == checkpoint_costs.save_costs(ledger.full)
        checked["costs"] += 1
        return save_costs(recent)

    def pair_counted(history):
        d = pair(history)
        if d is not None:
            checked[d.kind] += 1
        return d

    monkeypatch.setattr(recovery, "decide", decide_both)
    monkeypatch.setattr(recovery, "across_progress", pair_counted)
    monkeypatch.setattr(engine, "mtbf_s", mtbf_both)
    monkeypatch.setattr(engine, "save_costs", costs_both)
    s = replace(SMALL, days=4, gpu_mtbf_h=800 * 1.5, planned_per_day=1.0, max_restarts=2, faults=faults)
    run = Run(s, STRATEGIES["elastic"], seed=seed, ledger=ledger)
    holder["run"] = run
    run.run()
    assert checked["decide"] > 50 and checked["mtbf"] > 100 and checked["costs"] > 100
    assert run.restarts["gave up"] and run.restarts["spare"] and run.restarts["planned stop"]
    if faults is PAIRS:
        assert checked["node"] and checked["code_bug"]


def test_every_gpu_hour_is_accounted_for():
    for name, strategy in STRATEGIES.items():
        o = outcome(Run(replace(SMALL, planned_per_day=0.5, spares=2), strategy, seed=0).run(), 0)
        assert o.productive_gpu_h + sum(o.lost_gpu_h.values()) == pytest.approx(o.paid_gpu_h, rel=1e-9), name
        assert 0 <= o.goodput < 1


def test_a_seed_gives_the_same_run_every_time():
    a, b, c = (outcome(Run(SMALL, STRATEGIES["spares"], seed).run(), seed) for seed in (5, 5, 6))
    assert a.lost_gpu_h == b.lost_gpu_h and a.interruptions == b.interruptions
    assert a.lost_gpu_h != c.lost_gpu_h



def test_a_shrunk_run_grows_back_when_a_node_returns_and_it_pays():
    """Ten nodes, no spare, GPU faults cured by a reset: the run shrinks, the node comes back as
    a spare, and at the next checkpoint boundary losing 1 node in 10 is worth a restart."""
    reset = Fault("reset", "gpu", 1.0, "RuntimeError: CUDA error", xid=94, xid_rst=True)
    s = replace(SMALL, gpus=80, gpu_mtbf_h=80 * 6.0, days=10, spares=0, min_nodes=5, faults=(reset,), reset_s=300)
    run = Run(s, STRATEGIES["elastic"], seed=0, ledger=Ledger(keep_full=True)).run()
    assert run.restarts["shrink"] > 0 and run.restarts["grow back"] > 0
    grown = [e for e in events(run, "stop") if e.details.reason.startswith("grow back to 10 of 10 nodes")]
    assert len(grown) == run.restarts["grow back"]
