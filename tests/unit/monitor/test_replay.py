"""Replay verification's comparison and decisions (monitor/replay.py), table by table."""

import math

import pytest

from resilient_slurm.ledger import ConfigChanged, Event, OomRetry, Resume, Rollback, Start
from resilient_slurm.monitor import replay
from resilient_slurm.monitor.replay import Expected, Replay, decide, expectations, same_value


@pytest.mark.parametrize("expected, got, same", [
    (2.5, 2.5, True),
    (2.5, math.nextafter(2.5, 3.0), False),  # one ulp is a difference
    (0.0, -0.0, False),  # equal as numbers, not as bits
    (float("nan"), float("nan"), True),  # JSON keeps no NaN payload
    (float("nan"), 2.5, False),
    (2.5, float("inf"), False),
])
def test_values_compare_bit_for_bit(expected, got, same):
    assert same_value(expected, got) is same


def _event(details, step=None):
    return Event(details, "", step, 0, "1", 0, None, None)


def _start(world=2):
    return _event(Start(world_size=world, pid=1, host="n1"), 0)


def _losses(first):
    return {s: 10.0 - s for s in range(first, 34)}


@pytest.mark.parametrize("history, world, deterministic, losses, why", [
    # the attempt before computed steps 1..33 from a fresh start: all of them are expected
    ([_start(), _start()], 2, True, _losses(26), None),
    # it resumed at 28: the rows up to 28 came from an older attempt
    ([_start(), _event(Resume(checkpoint="c", has_optimizer=True, source="hot", saved_world_size=2), 28), _start()],
     2, True, _losses(29), None),
    # it rolled back to 30: the rows before came from before the rollback
    ([_start(), _event(Rollback(reason="nan", anomaly_step=31, checkpoint="c", skipped_batches=1,
                                skipped_positions=[0, 4], skipped_samples=[], lr_scale=1.0), 30), _start()],
     2, True, _losses(31), None),
    ([_start(world=4), _start()], 2, True, {}, "world size changed"),
    ([_start(), _event(OomRetry(ranks=[0], error="", old_micro_batch=2, new_micro_batch=1, configured_micro_batch=2,
                                accumulation=2, memory={}), 30), _start()], 2, True, {}, "oom_retry"),
    ([_start(), _event(ConfigChanged(changed={"optim.lr": [1, 2]}, reason="pbt")), _start()], 2, True, {},
     "config changed"),
    ([_start()], 2, True, {}, "no earlier attempt"),
    ([_start(), _start()], 2, False, {}, "train.deterministic=true"),
])
def test_expectations_only_what_the_attempt_before_computed_under_the_same_conditions(history, world, deterministic,
                                                                                  losses, why):
    rows = [{"step": s, "loss": 10.0 - s} for s in range(26, 34)]
    got = expectations(rows, history, world, deterministic)
    assert got.losses == losses
    assert (got.why_not is None) if why is None else (why in got.why_not)


def test_a_replay_compares_the_expected_steps_and_keeps_the_difference_until_acted_on():
    r = Replay()
    r.arm(Expected({31: 1.5, 32: 1.25, 33: 1.0}, 22))
    assert r.check(30, {"loss": 9.0}) is None and r.compared == 0  # not expected
    assert r.check(31, {"loss": 1.5}) is None and r.compared == 1
    assert r.check(32, {"grad_norm": 1.0}) is None and r.compared == 1  # no loss logged: nothing compared
    found = r.check(32, {"loss": 1.2500001})
    assert found == replay.Mismatch(32, 1.25, 1.2500001) and r.mismatch == found and not r.done(33)
    # fallen back to step 25: the rows moved aside then are expected too; known steps keep their value
    r.fell_back([{"step": 26, "loss": 2.0}, {"step": 31, "loss": 7.0}, {"step": 20, "loss": 3.0}])
    assert r.losses == {26: 2.0, 31: 1.5, 32: 1.25, 33: 1.0} and r.tries == 1 and r.mismatch is None
    assert (r.compared, r.first) == (0, None)
    assert not r.done(32) and r.done(33)
    r.clear()
    assert not r.armed and not r.done(40)


@pytest.mark.parametrize("tries, source, earlier, action, before, drained", [
    (1, "memory", [], "fallback", 31, ()),  # the memory copy aside; step 30's next copy, else older
    (2, "hot", [], "fallback", 31, ()),
    (1, "cold", [], "fallback", 30, ()),  # the cold copy is the last one of step 30
    (3, "hot", [], "continue", None, ()),  # persisted, two nodes: cannot tell which
    (3, "hot", [["b", "c"]], "drain", None, ("b",)),  # an earlier persistent one on b and c: b is common
    (3, "hot", [["c", "d"]], "continue", None, ()),  # nothing in common: another node's trouble
])
def test_decisions(tries, source, earlier, action, before, drained):
    d = decide(tries, 2, 30, source, ["a", "b"], earlier)
    assert (d.action, d.before_step, d.drain) == (action, before, drained)
    assert d.reason


def test_a_one_node_run_drains_its_node_when_the_difference_persists():
    assert decide(2, 1, 30, "hot", ["n1"], []).drain == ("n1",)
    assert decide(1, 0, 30, "memory", ["n1"], []).action == "drain"  # no fallbacks allowed
