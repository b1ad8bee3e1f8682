"""Loading: in place, RNG states for ranks a checkpoint has none for, and the fallback across tiers."""

import pytest
import torch

from resilient_slurm.checkpoint.load import CheckpointRefused, load_into, resume
from resilient_slurm.checkpoint.layout import step_dir_name
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import (
    capture_snapshot,
    held,
    optimizer_tensors,
    param_names,
)
from resilient_slurm.checkpoint.verify import verify
from tests.single_rank import one_rank
from tests.unit.checkpoint.tiny import trained

COMM = one_rank()




def saved(root, step, seed=0):
    model, opt, sched = trained(seed)
    snap = capture_snapshot(model, opt, sched, TrainState(step=step, run_id="abc"))
    return save(root, step, snap, COMM, 1 << 30, 2).path, (model, opt)


def test_optimizer_state_that_exists_is_loaded_in_place(tmp_path):
    path, (model, opt) = saved(tmp_path, 1)
    target_model, target_opt, target_sched = trained(7)
    before = {n: h.data.data_ptr() for n, h in optimizer_tensors(target_opt, param_names(target_model)).items()}
    load_into(path, verify(path).manifest, 0, target_model, target_opt, target_sched, io_threads=2)
    after = optimizer_tensors(target_opt, param_names(target_model))
    assert {n: h.data.data_ptr() for n, h in after.items()} == before
    for n, h in optimizer_tensors(opt, param_names(model)).items():
        assert torch.equal(after[n].data, h.data)


def test_a_rank_without_saved_rng_states_is_seeded_from_run_step_and_rank(tmp_path):
    path, _ = saved(tmp_path, 3)  # saved by one rank: only rng/rank-00000.json
    draws = {}
    for rank in (1, 1, 2):
        restored = load_into(path, verify(path).manifest, rank, *trained(0), io_threads=1)
        assert restored.rng == "reseeded" and restored.saved_world_size == 1
        draws.setdefault(rank, []).append(torch.rand(4))
    assert torch.equal(draws[1][0], draws[1][1])  # reproducible
    assert not torch.equal(draws[1][0], draws[2][0])  # independent streams per rank
    assert load_into(path, verify(path).manifest, 0, *trained(0), io_threads=1).rng == "restored"


class FailingCold:
    url = "mem://cold"

    def __init__(self, steps):
        self._steps = steps

    def steps(self):
        return self._steps

    def describe(self, step):
        return f"{self.url}/step_{step:08d}"

    def download(self, step, dest):
        raise OSError("connection reset")


def test_a_cold_copy_that_cannot_be_fetched_is_skipped_for_an_older_hot_one(tmp_path):
    saved(tmp_path, 2)
    outcome = resume(tmp_path, COMM, *trained(3), io_threads=1, cold=FailingCold([5, 2]))
    assert outcome.restored is not None and outcome.restored.train_state.step == 2
    assert outcome.restored.source == "hot"
    assert outcome.skipped == [("mem://cold/step_00000005", "copy from the cold tier failed: OSError: connection reset")]


def test_before_step_only_considers_earlier_checkpoints(tmp_path):
    for step in (2, 4, 6):
        saved(tmp_path, step)
    outcome = resume(tmp_path, COMM, *trained(3), io_threads=1, before_step=6)
    assert outcome.restored.train_state.step == 4 and not outcome.skipped


def test_a_refused_checkpoint_stops_the_resume_and_stays_in_place(tmp_path):
    path, _ = saved(tmp_path, 4)
    seen = []

    def refusal(train_state):
        seen.append(train_state.step)
        return "another base model"

    with pytest.raises(CheckpointRefused) as err:
        resume(tmp_path, COMM, *trained(1), io_threads=1, refusal=refusal)
    assert str(err.value) == f"{path}: another base model" and seen == [4]
    assert path.is_dir() and not (tmp_path / ".quarantine").exists()
    assert resume(tmp_path, COMM, *trained(1), io_threads=1, refusal=lambda ts: None).restored.path == path


def test_a_checkpoint_with_a_tensor_no_rank_holds_is_refused_and_kept(tmp_path):
    """A saved tensor some rank lacks may be another stage's; one no rank holds is a changed model."""
    model, opt, sched = trained(0)
    snap = capture_snapshot(model, opt, sched, TrainState(step=2))
    snap.model["model.extra.weight"] = held(torch.zeros(3), "model.extra.weight")
    save(tmp_path, 2, snap, COMM, 1 << 30, 2)
    with pytest.raises(CheckpointRefused, match="holds tensor 'model.extra.weight', which no rank of this model holds"):
        resume(tmp_path, COMM, *trained(1), io_threads=2)
    assert (tmp_path / step_dir_name(2)).is_dir()  # a changed model is not damage: nothing moved aside
