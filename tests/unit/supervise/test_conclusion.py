"""The driver's conclusion when a start ended, one typed outcome per case (pure, from ledger events
as the ranks and the driver write them)."""

import pytest

from resilient_slurm import recovery
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import parse
from resilient_slurm.slurm.placement import Allocation, Move, swap_out
from resilient_slurm.slurm.step_end import StepEnd, Untraced
from resilient_slurm.supervise.conclusion import (
    DriverMove,
    Ended,
    Finished,
    GiveUp,
    LeaveToSlurm,
    Requeue,
    RestartHere,
    conclude,
)

ALLOC = Allocation(("n1", "n2"), ("n3",), 2, 2)
NO_SPARE = Allocation(("n1", "n2"), (), 2, 2)
T = "2026-12-01T10:00:00.000Z"


def event(kind, rank=0, node="n1", step=10, job_step=0, **fields):
    return parse({"time": T, "event": kind, "step": step, "rank": rank, "job_id": "7", "restart": 0,
                  "job_step": job_step, "node": node, **fields})


CRASH = event("crash", rank=1, node="n2", error="RuntimeError: boom", traceback="")
SAVE = event("save", step=5, path="/c/step_5", reason="periodic", seconds=1.0, blocking_s=0.1)


def ended(end, history=(), alloc=ALLOC, **kw):
    return Ended(end=end, ours=tuple(history), history=tuple(history), allocation=alloc, nodes=alloc.in_use,
                 srun_code=1, stop_requested=kw.pop("stop", False), max_restarts=3, ended_at=1000.0,
                 last_step=10, **kw)


LOST = Untraced("n2", 1, "Killed")


@pytest.mark.parametrize("facts, outcome, detail", [
    (ended(StepEnd(ExitCode.DONE)), Finished, "finished at step 10"),
    # srun could not start the step: only a new allocation can
    (ended(None), Requeue, "srun could not start a step on n1,n2 (exit 1)"),
    (ended(None, stop=True), LeaveToSlurm, ""),
    # Slurm is ending the job (scancel, requeue): it decides
    (ended(StepEnd(ExitCode.RESUME, signal="SIGTERM")), LeaveToSlurm, ""),
    (ended(StepEnd(ExitCode.FAILED, error="x"), [CRASH], stop=True), LeaveToSlurm, ""),
    # the time-limit warning: every rank saved; only the queue helps
    (ended(StepEnd(ExitCode.RESUME, signal="SIGUSR1")), Requeue, "SIGUSR1"),
    # a crash with no node at fault: in place
    (ended(StepEnd(ExitCode.FAILED, error="RuntimeError: boom"), [CRASH]), RestartHere, Move.IN_PLACE),
    # a rank that vanished: its node replaced by the spare
    (ended(StepEnd(ExitCode.FAILED, error=LOST.error, untraced=(LOST,)), [CRASH]), RestartHere, Move.SPARE),
    # ... and without a spare the job requeues without it
    (ended(StepEnd(ExitCode.FAILED, error=LOST.error, untraced=(LOST,)), [CRASH], alloc=NO_SPARE), Requeue, "n2"),
    (ended(StepEnd(ExitCode.GAVE_UP, error="out of memory at micro-batch 1")), GiveUp, "out of memory"),
])
def test_conclude(facts, outcome, detail):
    got = conclude(facts)
    assert type(got) is outcome, got
    if isinstance(got, Finished):
        assert got.reason == detail
    elif isinstance(got, Requeue):
        assert detail in got.decision.reason or detail in got.decision.exclude_nodes
    elif isinstance(got, RestartHere):
        assert got.restart.move == detail.value and got.restart.nodes == got.allocation.in_use
        assert got.restart.failed_at == min(1000.0, got.restart.failed_at) and got.restart.path == "step"
    elif isinstance(got, GiveUp):
        assert detail in got.reason


def test_the_failure_counts_from_its_first_trace_and_the_budget_still_holds():
    got = conclude(ended(StepEnd(ExitCode.FAILED, error=LOST.error, untraced=(LOST,)), [CRASH], report_times=(990.0,),
                         decided_at=995.0, killed_at=997.0, refused="a hang"))
    assert isinstance(got, RestartHere)
    r = got.restart
    assert (r.replaced, r.added, r.why, r.decided_at, r.ended_at) == (("n2",), ("n3",), "a hang", 995.0, 997.0)
    assert r.failed_at < 995.0 and r.cause.startswith("failure 1 without progress")
    # four starts in a row failed without a checkpoint between them: out of the restart budget of 3
    history = [event("crash", rank=1, node=f"n{s % 2 + 1}", job_step=s, error="RuntimeError: boom", traceback="")
               for s in range(5)]
    assert isinstance(conclude(ended(StepEnd(ExitCode.FAILED, error="RuntimeError: boom"), history)), GiveUp)


def test_the_driver_s_own_move_restarts_on_its_placement_only_after_its_own_stop():
    swap = swap_out(ALLOC, "n2", "slow")
    assert swap is not None and swap.move is Move.SWAP
    move = DriverMove(swap, "straggler on n2", "USR2", since=900.0, asked_at=950.0)
    got = conclude(ended(StepEnd(ExitCode.RESUME, signal="SIGUSR2"), [SAVE], move=move, killed_at=980.0))
    assert isinstance(got, RestartHere) and got.allocation.in_use == ("n1", "n3") and "n2" in got.allocation.failed
    r = got.restart
    assert (r.move, r.replaced, r.added, r.failed_at, r.decided_at, r.ended_at) == \
        ("swap", ("n2",), ("n3",), 900.0, 950.0, 980.0)
    # the time-limit warning came first: the queue, not the move
    assert isinstance(conclude(ended(StepEnd(ExitCode.RESUME, signal="SIGUSR1"), [SAVE], move=move)), Requeue)
    # Slurm is ending the job meanwhile: it decides
    assert isinstance(conclude(ended(StepEnd(ExitCode.RESUME, signal="SIGUSR2"), [SAVE], move=move, stop=True)),
                      LeaveToSlurm)


def test_swap_out_needs_a_spare_and_keeps_the_other_nodes_in_place():
    assert swap_out(NO_SPARE, "n2", "slow") is None
    assert swap_out(ALLOC, "n9", "slow") is None  # not in use
    p = swap_out(Allocation(("a", "b", "c"), ("x", "y"), 3, 3, frozenset({"x"})), "b", "slow")
    assert p.allocation.in_use == ("a", "y", "c") and p.allocation.spares == ("x",) and p.added == ("y",)
    assert p.allocation.failed == {"x", "b"} and "b swapped for spare y: slow" == p.reason
    assert recovery.Action.REQUEUE  # the module's decisions stay recovery's
