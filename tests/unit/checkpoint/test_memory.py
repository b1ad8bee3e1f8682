"""The memory tier on one rank, through the Checkpointer: the save returns before its copy, the next
optimizer step waits for the copy (so the checkpoint holds the state of its step), resume prefers
memory unless the hot tier is newer, retention, failures, the size check at start, and cleanup.
The tier's directory is under the test's tmp_path (a disk, not tmpfs): the code is the same."""

import errno
import threading

import pytest
import torch

from resilient_slurm.checkpoint import layout, memory, memory_files
from resilient_slurm.checkpoint import save as save_module
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.memory import MemoryTierTooSmall, load_newest
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import CheckpointConfig, ClusterConfig, MemoryTierConfig
from resilient_slurm.ledger import EventLog, Kind, read_events
from tests.single_rank import one_rank
from tests.unit.checkpoint.conftest import snapshot
from tests.unit.checkpoint.tiny import trained


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "exp" / "run"
    d.mkdir(parents=True)
    return d


def config(tmp_path, keep_last=1, **cfg) -> CheckpointConfig:
    return CheckpointConfig(memory=MemoryTierConfig(every_steps=1, dir=str(tmp_path / "shm"), keep_last=keep_last),
                            io_threads=2, **cfg)


def make(run_dir, cfg) -> Checkpointer:
    return Checkpointer(run_dir, cfg, ClusterConfig(), one_rank(), EventLog(run_dir / "events.jsonl"))


def memory_root(tmp_path):
    return tmp_path / "shm" / "exp" / "run"


def ledger(run_dir, kind):
    return [e for e in read_events(run_dir / "events.jsonl") if e.kind is Kind(kind)]


def state(model, opt):
    return {**{k: v.clone() for k, v in model.state_dict().items()},
            **{f"{id(p)}.{k}": v.clone() for p, s in opt.state.items() for k, v in s.items()}}


def train_step(model, opt, sched):
    model(torch.randint(0, 64, (2, 8))).sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()


@pytest.fixture
def gated_writes(monkeypatch):
    """The tier's writes wait until the test releases them."""
    release = threading.Event()
    real = save_module.write_files

    def gated(outs, threads, *direct):
        release.wait(10)
        return real(outs, threads, *direct)

    monkeypatch.setattr(save_module, "write_files", gated)
    yield release
    release.set()


def test_a_memory_save_returns_before_its_copy_and_commits_in_host_memory(tmp_path, run_dir, gated_writes):
    cp = make(run_dir, config(tmp_path))
    assert cp.memory_due(3) and not make(run_dir, CheckpointConfig()).memory_due(3)
    cp.save_memory(3, snapshot(3))  # returns while the copy's writes are still held back by the gate
    assert not ledger(run_dir, "memory_save")
    gated_writes.set()
    cp.close()
    (saved,) = ledger(run_dir, "memory_save")
    assert saved.details.ok and saved.step == 3 and saved.details.blocking_s <= saved.details.copy_s
    assert saved.details.copy_s <= saved.details.seconds and saved.details.bytes > 0
    path = memory_root(tmp_path) / "step_00000003"
    assert saved.details.path == str(path) and verify(path, checksums=True).ok
    assert (memory_root(tmp_path) / memory_files.CLAIM).is_file()
    assert not (run_dir / "checkpoints").exists()  # the disk tiers are not touched


def test_the_next_optimizer_step_waits_until_the_saved_bytes_are_out_of_the_tensors(tmp_path, run_dir,
                                                                                   gated_writes):
    model, opt, sched = trained(seed=1)
    cp = make(run_dir, config(tmp_path))
    cp.resume(model, opt, sched)  # nothing to load; installs the guard on the optimizer
    before = state(model, opt)
    cp.save_memory(1, capture_snapshot(model, opt, sched, TrainState(step=1)))
    stepper = threading.Thread(target=train_step, args=(model, opt, sched))
    stepper.start()
    stepper.join(0.5)
    assert stepper.is_alive(), "the optimizer step ran while the save was still copying"
    assert all(torch.equal(v, state(model, opt)[k]) for k, v in before.items())
    gated_writes.set()
    stepper.join(10)
    assert not stepper.is_alive()
    after = state(model, opt)
    cp.close()

    fresh_model, fresh_opt, fresh_sched = trained(seed=2)
    restored = load_newest(run_dir, config(tmp_path), one_rank(), fresh_model, fresh_opt, fresh_sched)
    assert restored is not None and restored.source == "memory" and restored.train_state.step == 1
    params = {k: v for k, v in fresh_model.state_dict().items()}
    assert all(torch.equal(params[k], before[k]) for k in params)  # the state of step 1, not the one after
    assert any(not torch.equal(params[k], after[k]) for k in params)


def test_a_resume_takes_the_memory_checkpoint_unless_the_hot_tier_holds_a_newer_one(tmp_path, run_dir):
    model, opt, sched = trained(seed=1)
    cp = make(run_dir, config(tmp_path, async_save=False))
    cp.resume(model, opt, sched)
    cp.save(2, capture_snapshot(model, opt, sched, TrainState(step=2)), "periodic")
    cp.save_memory(3, capture_snapshot(model, opt, sched, TrainState(step=3)))
    cp.close()

    cp = make(run_dir, config(tmp_path, async_save=False))
    outcome = cp.resume(*trained(seed=2))
    assert (outcome.restored.source, outcome.restored.train_state.step) == ("memory", 3)
    assert str(outcome.restored.path).startswith(str(memory_root(tmp_path)))
    cp.save(4, capture_snapshot(model, opt, sched, TrainState(step=4)), "periodic")
    cp.close()

    cp = make(run_dir, config(tmp_path, async_save=False))
    outcome = cp.resume(*trained(seed=2))
    assert (outcome.restored.source, outcome.restored.train_state.step) == ("hot", 4)
    cp.close()


@pytest.mark.parametrize("keep_last, kept", [(1, ["step_00000003"]), (2, ["step_00000002", "step_00000003"])])
def test_the_tier_keeps_its_newest_checkpoints(tmp_path, run_dir, keep_last, kept):
    cp = make(run_dir, config(tmp_path, keep_last=keep_last))
    for step in (1, 2, 3):
        cp.save_memory(step, snapshot(step))
    cp.close()
    assert sorted(p.name for p in memory_root(tmp_path).iterdir() if not p.name.startswith(".")) == kept
    assert [e.details.ok for e in ledger(run_dir, "memory_save")] == [True, True, True]


def test_a_failed_memory_save_is_recorded_and_the_previous_one_stays(tmp_path, run_dir, monkeypatch):
    cp = make(run_dir, config(tmp_path))
    cp.save_memory(1, snapshot(1))
    cp.memory.wait()

    def full(outs, threads, *direct):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module, "write_files", full)
    cp.save_memory(2, snapshot(2))
    cp.close()
    ok, failed = ledger(run_dir, "memory_save")
    assert ok.details.ok and not failed.details.ok and "No space left" in failed.details.problems[0]
    assert [p.name for p in memory_root(tmp_path).iterdir() if not p.name.startswith(".")] == ["step_00000001"]


def test_state_on_a_device_is_staged_before_the_call_returns(tmp_path, run_dir, monkeypatch, gated_writes):
    # No GPU here: the staging path is forced, and runs the same code on CPU tensors.
    monkeypatch.setattr(memory, "_on_device", lambda snap: True)
    cp = make(run_dir, config(tmp_path))
    snap = snapshot(4)
    cp.save_memory(4, snap)
    assert cp.memory.stager.allocated_bytes > 0 and cp.memory._copied.is_set()  # nothing for the optimizer to wait on
    for h in snap.model.values():
        h.data.add_(1.0)  # the live state moves on; the staged copy does not
    gated_writes.set()
    cp.close()
    path = memory_root(tmp_path) / "step_00000004"
    assert verify(path, checksums=True).ok
    from safetensors.torch import load_file

    saved = load_file(path / "model.safetensors")
    assert torch.equal(saved["lm_head.weight"], snapshot(4).model["lm_head.weight"].data)


def test_a_tier_that_does_not_fit_the_node_is_refused_at_start_in_one_line(tmp_path, run_dir, monkeypatch):
    monkeypatch.setattr(memory_files, "mem_available", lambda: 10_000)  # a node with 10 kB available
    cp = make(run_dir, config(tmp_path))
    with pytest.raises(MemoryTierTooSmall) as refused:
        cp.resume(*trained(seed=1))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("checkpoint.memory.every_steps: node ")
    assert "checkpoint.memory.dir=" in message and "MemAvailable is 0.00 GB" in message
    cp.close()


def test_a_finished_run_deletes_its_memory_tier_and_an_interrupted_one_keeps_it(tmp_path, run_dir):
    cp = make(run_dir, config(tmp_path))
    cp.save_memory(1, snapshot(1))
    cp.close()
    assert (memory_root(tmp_path) / "step_00000001" / layout.MANIFEST).is_file()
    cp = make(run_dir, config(tmp_path))
    cp.close(finished=True)
    assert not memory_root(tmp_path).parent.exists()
