"""The Checkpointer on one rank: async saves, busy and failure policies, emergency plans, the
Young-Daly interval, and tiers."""

import errno
import os
import shutil
import threading
import time

import pytest
import torch

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint import save as save_module
from resilient_slurm.checkpoint.checkpointer import Checkpointer, CheckpointFailed
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import (
    CheckpointConfig,
    ClusterConfig,
    ColdTierConfig,
)
from resilient_slurm.ledger import EventLog, Kind, Start, parse, read_events
from tests.single_rank import one_rank
from tests.unit.checkpoint.conftest import snapshot
from tests.unit.checkpoint.tiny import trained


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "exp" / "run"
    d.mkdir(parents=True)
    return d


def make(run_dir, cluster=None, **cfg) -> Checkpointer:
    events = EventLog(run_dir / "events.jsonl")
    return Checkpointer(run_dir, CheckpointConfig(**cfg), cluster or ClusterConfig(), one_rank(),
                        events)


def ledger(run_dir, kind=None):
    return [e for e in read_events(run_dir / "events.jsonl") if kind is None or e.kind is Kind(kind)]


@pytest.fixture
def slow_writes(monkeypatch):
    """Background writes wait until the test releases them."""
    release = threading.Event()
    real = save_module.write_files

    def gated(outs, threads, *direct):
        release.wait(10)
        return real(outs, threads, *direct)

    monkeypatch.setattr(save_module, "write_files", gated)
    yield release
    release.set()


def test_an_async_save_returns_at_once_and_commits_in_the_background(run_dir, slow_writes):
    cp = make(run_dir)
    assert cp.save(5, snapshot(5), "periodic") is None
    assert cp.saver.busy and not ledger(run_dir, "save")
    slow_writes.set()
    cp.close()
    (saved,) = ledger(run_dir, "save")
    assert saved.details.mode == "async" and saved.step == 5 and saved.details.blocking_s <= saved.details.seconds
    assert verify(run_dir / "checkpoints" / "step_00000005").ok


@pytest.mark.parametrize("if_busy, committed", [("wait", [1, 2]), ("skip", [1])])
def test_a_save_due_while_one_is_in_flight_waits_or_is_skipped(run_dir, slow_writes, if_busy, committed):
    cp = make(run_dir, if_busy=if_busy)
    cp.save(1, snapshot(1), "periodic")
    threading.Timer(0.2, slow_writes.set).start()
    cp.save(2, snapshot(2), "periodic")
    cp.close()
    assert [e.step for e in ledger(run_dir, "save")] == committed
    assert len(ledger(run_dir, "save_skipped")) == (if_busy == "skip")


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_a_failed_background_save_is_recorded_and_the_run_continues_or_stops(run_dir, monkeypatch, policy):
    cp = make(run_dir, on_failure=policy)
    cp.save(1, snapshot(1), "periodic")
    cp.saver.wait()

    def full(outs, threads, *direct):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module, "write_files", full)
    cp.save(2, snapshot(2), "periodic")
    cp.saver.wait()
    (failed,) = ledger(run_dir, "save_failed")
    assert failed.step == 2 and "No space left on device" in failed.details.error
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000001"]  # nothing torn is left
    monkeypatch.undo()
    if policy == "stop":
        with pytest.raises(CheckpointFailed, match="No space left"):
            cp.save(3, snapshot(3), "periodic")
    else:
        cp.save(3, snapshot(3), "periodic")
    cp.close()


def small_snapshot_costs(cp, write_bytes_per_s):
    cp.ledger = [parse({"event": "save", "bytes": int(write_bytes_per_s), "seconds": 1.0})]


@pytest.mark.parametrize(
    "seconds_since_signal, plan",
    [(0.0, "full"), (100.0, "weights-only"), (119.5, "none")],
)
def test_emergency_save_takes_the_most_that_fits_before_the_kill(run_dir, seconds_since_signal, plan):
    cp = make(run_dir, cluster=ClusterConfig(signal_lead_s=120), emergency_reserve_s=0.0)
    # 1 kB/s: the whole snapshot (~17 kB) takes ~25 s with the margin, the weights (~8 kB) ~13 s.
    small_snapshot_costs(cp, 1000)
    result = cp.emergency_save(9, snapshot(9), "SIGUSR1", time.time() - seconds_since_signal)
    cp.close()
    (chosen,) = ledger(run_dir, "emergency_plan")
    assert chosen.details.plan == plan and chosen.details.signal == "SIGUSR1"
    assert chosen.details.budget_s == pytest.approx(120.0 - seconds_since_signal, abs=1.0)
    if plan == "none":
        assert result is None and not ledger(run_dir, "save")
        return
    (saved,) = ledger(run_dir, "save")
    assert saved.details.reason == "emergency" and saved.details.plan == plan and saved.details.mode == "sync"
    assert saved.details.has_optimizer is (plan == "full")
    files = verify(result.path).manifest.files
    assert any(layout.is_optimizer_file(f) for f in files) is (plan == "full")


def test_a_stop_with_no_deadline_saves_everything(run_dir):
    cp = make(run_dir)
    cp.emergency_save(3, snapshot(3), None, None)
    cp.close()
    (chosen,) = ledger(run_dir, "emergency_plan")
    assert chosen.details.plan == "full" and chosen.details.budget_s is None




def job_snapshot(model, opt, sched, step):
    return capture_snapshot(model, opt, sched, TrainState(step=step, run_id="r"))


def test_young_daly_sets_the_interval_from_measured_cost_and_records_changes(run_dir):
    cp = make(run_dir, young_daly=True, mtbf_prior_h=1.0, min_interval_s=1.0, max_interval_s=10_000.0)
    cp.events.emit(Start(world_size=1, pid=os.getpid(), host="here"), 0)
    model, opt, sched = trained(0)
    cp.resume(model, opt, sched)
    assert not ledger(run_dir, "checkpoint_interval")  # nothing measured yet: min_interval_s until the first save
    cp.clock = cp.clock.__class__(0, time.time() - 1.5)
    assert cp.time_due()
    cp.save(1, job_snapshot(model, opt, sched, 1), "time")
    cp.close()
    (iv,) = ledger(run_dir, "checkpoint_interval")
    saved = ledger(run_dir, "save")[0]
    expected = max((2 * saved.details.blocking_s * 3600.0) ** 0.5, saved.details.seconds, 1.0)
    assert iv.details.interval_s == pytest.approx(expected, rel=0.01, abs=0.05)  # the event rounds to 0.1 s
    assert iv.details.failures == 0 and iv.details.mtbf_h == pytest.approx(1.0, abs=0.01)
    assert cp.interval.seconds == pytest.approx(expected, rel=0.01)


def test_resume_falls_back_to_the_cold_tier_and_catches_up_copies(run_dir, tmp_path):
    tiers = dict(hot_dir=str(tmp_path / "hot"), cold=ColdTierConfig(url=str(tmp_path / "cold")))
    cp = make(run_dir, **tiers)
    model, opt, sched = trained(0)
    cp.resume(*trained(5))
    cp.save(4, job_snapshot(model, opt, sched, 4), "final")
    cp.close()
    assert [e.step for e in ledger(run_dir, "cold_copy")] == [4]
    assert (tmp_path / "cold" / "exp" / "run" / "step_00000004" / "manifest.json").is_file()

    shutil.rmtree(tmp_path / "hot")  # a replacement node
    fresh = trained(1)
    outcome = make(run_dir, **tiers).resume(*fresh)
    assert outcome.restored is not None and outcome.restored.source == "cold"
    assert outcome.restored.train_state.step == 4
    for a, b in zip(model.state_dict().values(), fresh[0].state_dict().values()):
        assert torch.equal(a, b)
    assert verify(tmp_path / "hot" / "exp" / "run" / "step_00000004").ok  # now cached in the hot tier again


def test_a_cold_copy_an_emergency_left_to_the_next_start_is_made_there(run_dir, tmp_path):
    tiers = dict(hot_dir=str(tmp_path / "hot"), cold=ColdTierConfig(url=str(tmp_path / "cold")),
                 emergency_reserve_s=0.0)
    cp = make(run_dir, cluster=ClusterConfig(term_grace_s=30.0), **tiers)
    model, opt, sched = trained(0)
    cp.resume(*trained(5))
    # Saves measured at 1 MB/s, copies to the cold tier at 1 kB/s: the copy cannot fit in 30 s.
    cp.ledger = [parse({"event": "save", "bytes": 10**6, "seconds": 1.0}),
                 parse({"event": "cold_copy", "bytes": 1000, "seconds": 1.0})]
    cp.emergency_save(6, job_snapshot(model, opt, sched, 6), "SIGTERM", time.time())
    cp.close()
    assert ledger(run_dir, "emergency_plan")[0].details.plan == "full"
    assert not ledger(run_dir, "cold_copy")

    nxt = make(run_dir, **tiers)
    nxt.resume(*trained(1))
    nxt.close()
    assert [e.step for e in ledger(run_dir, "cold_copy")] == [6]


def test_retention_keeps_a_pinned_checkpoint_until_it_is_unpinned(run_dir):
    """A PBT member copying another's checkpoint pins it (sweep/exploit.py)."""
    from resilient_slurm.checkpoint import store

    ckpt = make(run_dir, keep_last=2, optimizer_on_last=0, async_save=False)
    ckpt.save(1, snapshot(1), "periodic")
    pin = store.pin(ckpt.root, 1, "other-run")
    assert store.pinned_steps(ckpt.root) == {1}
    for step in (2, 3, 4):
        ckpt.save(step, snapshot(step), "periodic")
    assert sorted(s for s, _ in store.list_step_dirs(ckpt.root)) == [1, 3, 4]
    store.unpin(pin)
    ckpt.save(5, snapshot(5), "periodic")
    assert sorted(s for s, _ in store.list_step_dirs(ckpt.root)) == [4, 5]


def test_a_pause_save_is_written_before_it_returns(run_dir):
    ckpt = make(run_dir)  # async saves on: a periodic save would return None at once
    result = ckpt.save(3, snapshot(3), "pause")
    assert result is not None and ckpt.committed_step == 3 and verify(result.path).ok
