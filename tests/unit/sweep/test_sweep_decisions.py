"""The pure decisions of a search: ASHA rungs and promotions, PBT exploit and explore, the objective
from metrics rows (each step once, across a requeue), how a launch ended, and a restart's replay."""

import random

import pytest

from resilient_slurm.ledger import (
    Crash,
    Event,
    Finish,
    GaveUp,
    Paused,
    PbtGeneration,
    Stop,
    Submitted,
    TrialLaunched,
    TrialPaused,
    TrialPromoted,
    TrialPruned,
)
from resilient_slurm.sweep import asha, feed, pbt
from resilient_slurm.sweep.outcome import Ended, classify
from resilient_slurm.sweep.replay import CopyIntent, Status, replay
from resilient_slurm.sweep.space import Dimension


@pytest.mark.parametrize("min_steps, eta, max_steps, rungs", [
    (10, 3, 90, (10, 30, 90)), (10, 2, 40, (10, 20, 40)), (0, 3, 90, (10, 30, 90)), (10, 3, 100, (10, 30, 90, 100)),
    (100, 3, 90, (90,)),
])
def test_rungs(min_steps, eta, max_steps, rungs):
    assert asha.rungs(min_steps, eta, max_steps) == rungs


@pytest.mark.parametrize("results, paused, promoted", [
    # One result at rung 0: the best 1/2 of one trial is nobody.
    ({0: {0: 1.0}}, {0: 0}, None),
    # Two: the better one goes on.
    ({0: {0: 1.0}, 1: {0: 0.5}}, {0: 0, 1: 0}, (1, 0)),
    # The best is already promoted (not paused): nobody else is in the top half of two.
    ({0: {0: 1.0}, 1: {0: 0.5, 1: 0.4}}, {0: 0}, None),
    # Four at rung 0, the top two are 1 and 3; 1 went on, 3 waits.
    ({0: {0: 1.0}, 1: {0: 0.5, 1: 0.4}, 2: {0: 2.0}, 3: {0: 0.7}}, {0: 0, 2: 0, 3: 0}, (3, 0)),
    # The higher rung first.
    ({0: {0: 0.1, 1: 0.2}, 1: {0: 0.3, 1: 0.1}, 2: {0: 0.2}, 3: {0: 0.9}}, {0: 1, 1: 1, 2: 0, 3: 0}, (1, 1)),
])
def test_asha_promotes_from_the_highest_rung_the_best_1_over_eta(results, paused, promoted):
    p = asha.promotion(results, paused, eta=2, direction="minimize", top_rung=2)
    assert (p.trial, p.rung) == promoted if promoted else p is None


def test_asha_maximises_when_asked():
    p = asha.promotion({0: {0: 1.0}, 1: {0: 0.5}}, {0: 0, 1: 0}, 2, "maximize", 2)
    assert p.trial == 0


def test_pbt_bottom_quantile_copies_the_top_and_explores():
    dims = [Dimension("optim.lr", low=1e-5, high=1e-3, log=True), Dimension("optim.warmup_steps", choices=(5, 10, 20))]
    params = {n: {"optim.lr": 1e-4 * (n + 1), "optim.warmup_steps": 10} for n in range(8)}
    scores = {n: float(n) for n in range(8)}  # 0 is best
    out = pbt.decide(scores, params, dims, 0.25, "minimize", [0.8, 1.2], 0.0, random.Random(1))
    assert [x.recipient for x in out] == [6, 7]
    assert all(x.donor in (0, 1) for x in out)
    for x in out:
        ratio = x.params["optim.lr"] / params[x.donor]["optim.lr"]
        assert ratio == pytest.approx(0.8) or ratio == pytest.approx(1.2)
        assert x.params["optim.warmup_steps"] in (5, 20) and x.how["optim.warmup_steps"] == "neighbour"


def test_pbt_is_reproducible_from_the_seed_and_resamples_with_its_probability():
    dims = [Dimension("optim.lr", low=1e-5, high=1e-3, log=True)]
    params = {0: {"optim.lr": 1e-4}, 1: {"optim.lr": 2e-4}}
    a = pbt.decide({0: 1.0, 1: 2.0}, params, dims, 0.5, "minimize", [0.8, 1.2], 1.0, random.Random("s-1"))
    b = pbt.decide({0: 1.0, 1: 2.0}, params, dims, 0.5, "minimize", [0.8, 1.2], 1.0, random.Random("s-1"))
    assert a == b and a[0].how == {"optim.lr": "resample"} and 1e-5 <= a[0].params["optim.lr"] <= 1e-3


def test_pbt_perturbs_a_small_integer_by_one_at_least():
    dims = [Dimension("optim.warmup_steps", low=1, high=100, integer=True)]
    new, _ = pbt.explore({"optim.warmup_steps": 2}, dims, [1.2], 0.0, random.Random(0))
    assert new == {"optim.warmup_steps": 3}


def test_pbt_generations():
    assert pbt.generation_steps(20, 60) == (20, 40, 60)
    assert pbt.generation_steps(0, 100) == (25, 50, 75, 100)


def test_a_requeued_trial_reports_each_step_once():
    """Its resume moves the steps after the checkpoint to metrics-lost.jsonl and writes them again."""
    first = [{"step": s, "loss": 5.0 - s / 100, **({"val_loss": 4.0 - s / 100} if s % 10 == 0 else {})}
             for s in range(1, 36)]
    reported = dict(feed.unread(first, "val_loss", 0))
    assert list(reported) == [10, 20, 30]
    # Requeued at 35, resumed from the checkpoint at 25: steps 26..35 are redone, then it goes on.
    again = first[:25] + [dict(r) for r in first[25:]] + [{"step": s, "loss": 1.0, "val_loss": 3.0}
                                                          for s in (40, 50)]
    new = feed.unread(again, "val_loss", max(reported))
    assert [s for s, _ in new] == [40, 50]
    assert feed.steps_computed(again, first[25:]) == len(again) + 10


def test_values_at_a_step_and_the_final_one():
    reported = {10: 3.0, 20: 2.0, 30: 1.5}
    assert (feed.value_at(reported, 25), feed.value_at(reported, 5), feed.final_value(reported)) == (2.0, None, 1.5)
    assert feed.values([{"step": 1, "val_loss": True}, {"step": 2}, {"step": 3, "val_loss": 1}], "val_loss") == \
        [(3, 1.0)]


def event(details, step=None):
    return Event(details=details, time="", step=step, rank=0)


LAUNCH = event(TrialLaunched(trial=0, run="r", target_step=40, why="new", params={}))


@pytest.mark.parametrize("after, ended, step", [
    ([event(Finish(tokens_seen=1), 40)], Ended.FINISHED, 40),
    ([event(Paused(saved=True), 20)], Ended.PAUSED, 20),
    ([event(TrialPruned(trial=0, run="r", value=1.0, reason="median"), 10), event(Stop(reason="t", checkpoint=None), 11)],
     Ended.PRUNED, 10),
    ([event(Stop(reason="SIGTERM", checkpoint=None), 12)], Ended.STOPPED, 12),
    ([event(Crash(error="boom\nmore", traceback=""), 3), event(GaveUp(reason="code bug"), 3)], Ended.FAILED, 3),
    ([event(Crash(error="boom", traceback=""), 3)], Ended.FAILED, 3),
    ([], Ended.FAILED, None),
])
def test_how_a_launch_ended(after, ended, step):
    old = [event(Paused(saved=True), 10), event(Submitted(), None)]
    outcome = classify(old + [LAUNCH] + after, "exit status 1")
    assert (outcome.ended, outcome.step) == (ended, step)
    assert "\n" not in outcome.reason


def test_pruned_before_the_job_saved():
    outcome = classify([LAUNCH, event(TrialPruned(trial=0, run="r", value=1.0, reason="median pruner"), 10)], "x")
    assert outcome.ended is Ended.PRUNED and outcome.reason == "median pruner"


def test_replay_knows_where_each_trial_stood():
    events = [
        event(TrialLaunched(trial=0, run="a", target_step=10, why="new", params={"x": 1}, job="7")),
        event(TrialLaunched(trial=1, run="b", target_step=10, why="new", params={"x": 2}, job="8")),
        event(TrialPaused(trial=0, run="a", value=1.0), 10),
        event(TrialPaused(trial=1, run="b", value=2.0), 10),
        event(TrialPromoted(trial=0, run="a", rung=0, value=1.0, target_step=30), 10),
        event(PbtGeneration(generation=1, scores=[[0, 1.0], [1, 2.0]],
                            exploits=[{"recipient": 1, "donor": 0, "params": {"x": 9}, "how": {"x": "perturb x1.2"}}]),
              10),
        event(TrialLaunched(trial=0, run="a", target_step=20, why="generation 2", params={"x": 1}, job="9")),
    ]
    where = replay(events, {10: 20, 20: 30})
    assert (where[0].status, where[0].target, where[0].jobs) == (Status.RUNNING, 20, ["7", "9"])
    assert (where[1].status, where[1].target, where[1].params) == (Status.PENDING, 20, {"x": 9})
    assert where[1].copy == CopyIntent(1, 0, 10, {"x": "perturb x1.2"})
    assert where[1].why == "generation 2" and where[1].jobs == ["8"]
