"""A run interrupted by SIGUSR1, SIGTERM and SIGKILL, resumed each time, ends bit-identical to one
that was never interrupted. Real processes, real signals, real torch, 2 ranks over gloo (one rank:
tests/integration/test_pretrain_runs.py, the same loop on a token mixture)."""

import signal

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import (
    SHORT,
    SHORT_EVERY as EVERY,
    SHORT_STEPS as STEPS,
    assert_bit_identical,
    events,
    final_tensors,
    finish,
    interrupt,
    launch,
    run_dir,
)

pytestmark = pytest.mark.slow


def test_interrupted_three_ways_ends_bit_identical(tmp_path, short_straight):
    ranks = 2
    extra = [f"cluster.ranks={ranks}", *SHORT]  # three interrupts, each between checkpoints
    rdir = run_dir(tmp_path, "resumed")
    code, out = interrupt(launch(tmp_path, "resumed", *extra), rdir, 12, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(tmp_path, "resumed", *extra), rdir, 27, signal.SIGTERM)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(launch(tmp_path, "resumed", *extra), rdir, 45, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(launch(tmp_path, "resumed", *extra))
    assert code == ExitCode.DONE, out

    assert_bit_identical(final_tensors(short_straight(ranks), STEPS), final_tensors(rdir, STEPS))

    ev = events(rdir)
    signals = [e for e in ev if e.kind is Kind.SIGNAL]
    assert [e.details.signal for e in signals] == ["SIGUSR1"] * ranks + ["SIGTERM"] * ranks  # each rank saw it
    stops = [e for e in ev if e.kind is Kind.STOP]
    emergency = [e for e in ev if e.kind is Kind.SAVE and e.details.reason == "emergency"]
    assert [s.step for s in stops] == [e.step for e in emergency]
    resumes = [e.step for e in ev if e.kind is Kind.RESUME]
    assert resumes[:2] == [s.step for s in stops]
    # after the SIGKILL, the run resumed from the newest periodic checkpoint before the kill
    killed_after = max(e.step for e in ev if e.kind is Kind.SAVE and e.step <= 45 + EVERY)
    assert resumes[2] % EVERY == 0 and resumes[2] >= 45 - EVERY and resumes[2] <= killed_after
    assert ev[-1].kind is Kind.FINISH and ev[-1].step == STEPS
