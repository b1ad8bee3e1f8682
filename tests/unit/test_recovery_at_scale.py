"""The crash-loop guard at 10,000 GPUs (issue 23): it must stop a real crash loop (the same code bug,
the same bad node) and must not stop a healthy run that simply has many independent failures.

The seed's run gives up about 5 times a month (2.7 in the issue's 3 seeds); every one of them is the
fault catalog's code-bug row striking its second time (20 seeds: 108 give-ups, 108 code bugs), so
the rule is kept. The rows below pin both sides of it; the last test runs the simulator at the
seed's scale with every fault but the code bug and asserts that nothing gives up."""

from dataclasses import replace

import pytest

from resilient_slurm.ledger import parse
from resilient_slurm.recovery import Action, decide
from resilient_slurm.simulate.engine import Run
from resilient_slurm.simulate.failures import FAULTS
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario

BUG = "IndexError: index 4096 is out of bounds for dimension 0 with size 4096"
PEER = "RuntimeError: NCCL communicator was aborted: connection closed by peer"
ERRORS = [f.error for f in FAULTS if not f.code_bug]


def ev(event, restart, step=None, **extra):
    return parse({"event": event, "step": step, "job_id": "7", "restart": restart, **extra})


def attempt(restart, node, error, step, saved=None, peer="n0000"):
    """One attempt: its start, a save at `saved` (progress, when above every save before), then a
    failure on `node` after `step`, which its peer on another node reports as a lost peer."""
    out = [ev("start", restart, 0)] + ([ev("save", restart, saved, reason="time")] if saved is not None else [])
    return out + [ev("crash", restart, step, error=error, node=node), ev("crash", restart, step, error=PEER, node=peer)]


def independent(n, progress_every=1):
    """`n` failures of a 10k-GPU month: a different node each time, the catalog's errors in turn,
    steps moving on; every `progress_every`-th attempt saved before it failed."""
    history = []
    for i in range(n):
        step = 100 * (i + 1)
        saved = step - 10 if i % progress_every == 0 else None
        history += attempt(i, f"n{1 + i % 1250:04d}", ERRORS[i % len(ERRORS)], step, saved)
    return history


STOPS = [
    ("a code bug: the same failure after the same step on two nodes",
     attempt(0, "n0004", BUG, 412, saved=400) + attempt(1, "n0006", BUG, 412), Action.GIVE_UP, "code bug"),
    ("a code bug across a checkpoint of its own",
     attempt(0, "n0004", BUG, 412, saved=400) + attempt(1, "n0006", BUG, 412, saved=406), Action.GIVE_UP,
     "code bug"),
    ("a node that cannot start after it failed training",
     attempt(0, "n0004", ERRORS[4], 412, saved=400) + attempt(1, "n0004", ERRORS[4], None), Action.REQUEUE,
     "follow node n0004"),
    ("failures that follow one node across steps without progress",
     attempt(0, "n0004", ERRORS[0], 412, saved=400) + attempt(1, "n0004", ERRORS[5], 401)
     + attempt(2, "n0004", ERRORS[6], 405), Action.REQUEUE, "follow node n0004"),
    ("failures without progress beyond the restart budget",
     attempt(0, "n0001", ERRORS[0], 412, saved=400) + attempt(1, "n0002", ERRORS[1], 401)
     + attempt(2, "n0003", ERRORS[2], 402) + attempt(3, "n0005", ERRORS[3], 403)
     + attempt(4, "n0007", ERRORS[5], 404), Action.GIVE_UP, "exceed the restart budget of 3"),
]
GOES_ON = [
    ("720 independent failures, each after progress", independent(720), "restart budget untouched"),
    ("720 independent failures, one in three before any progress", independent(720, progress_every=3),
     "failure 2 without progress"),
    ("the same error on two nodes at different steps, no progress between",
     attempt(0, "n0004", ERRORS[5], 412, saved=400) + attempt(1, "n0009", ERRORS[5], 405), "failure 1"),
    ("the same error again after progress, on another node and step",
     attempt(0, "n0004", ERRORS[6], 412, saved=400) + attempt(1, "n0009", ERRORS[6], 530, saved=500),
     "budget untouched"),
    ("three failures without progress on three nodes, within the budget",
     attempt(0, "n0001", ERRORS[0], 412, saved=400) + attempt(1, "n0002", ERRORS[1], 401)
     + attempt(2, "n0003", ERRORS[2], 402) + attempt(3, "n0005", ERRORS[3], 403), "failure 3 without progress"),
]


@pytest.mark.parametrize("history, action, reason", [row[1:] for row in STOPS], ids=[row[0] for row in STOPS])
def test_a_real_crash_loop_still_stops(history, action, reason):
    d = decide(1, None, "boom", history, max_restarts=3)
    assert d.action == action and reason in d.reason, d
    if action is Action.REQUEUE:
        assert d.exclude_nodes == ("n0004",)


@pytest.mark.parametrize("history, reason", [row[1:] for row in GOES_ON], ids=[row[0] for row in GOES_ON])
def test_independent_failures_on_different_nodes_do_not_stop_the_run(history, reason):
    d = decide(1, None, "boom", history, max_restarts=3)
    assert d.action == Action.REQUEUE and not d.exclude_nodes and reason in d.reason, d


@pytest.mark.parametrize("strategy", ["spares", "inprocess"])
def test_a_healthy_10k_gpu_run_never_gives_up(strategy):
    """10 days at the seed's scale and rates (about 240 failures a seed, recurrences included),
    every fault of the catalog but the code bug: no give-up, on the step-restart and the in-process
    path alike."""
    s = replace(Scenario(), days=10, faults=tuple(f for f in FAULTS if not f.code_bug))
    for seed in (0, 1):
        run = Run(s, STRATEGIES[strategy], seed).run()
        assert sum(run.interruptions.values()) > 200
        assert run.restarts["gave up"] == 0, (seed, run.restarts)
