"""No pickle: every file of a checkpoint is safetensors or JSON, and resuming never unpickles."""

import json
import pickle

import torch

from resilient_slurm.checkpoint.load import resume
from resilient_slurm.checkpoint.safetensors_io import read_header
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import (
    capture_snapshot,
    optimizer_tensors,
    param_names,
)
from resilient_slurm.config import OptimConfig
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.model.decoder import plain_model
from tests.single_rank import one_rank
from tests.unit.checkpoint.tiny import TINY, trained


def test_checkpoint_files_are_safetensors_or_json_and_resume_never_unpickles(tmp_path, monkeypatch):
    comm = one_rank()
    model, opt, sched = trained(0)
    names = param_names(model)
    snap = capture_snapshot(model, opt, sched, TrainState(step=1))
    ckpt = save(tmp_path, 1, snap, comm, 1 << 30, 2).path
    for f in ckpt.rglob("*"):
        if f.is_file():
            if f.suffix == ".json":
                json.loads(f.read_text())
            else:
                assert f.suffix == ".safetensors", f
                # A valid header whose tensors cover every byte after it leaves no room for anything else.
                read_header(str(f))

    def refuse(*_a, **_k):
        raise AssertionError("resume tried to unpickle")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    fresh = plain_model(TINY, 99)
    fresh_opt = build_optimizer(fresh, OptimConfig())
    fresh_sched = build_scheduler(fresh_opt, OptimConfig(), 10)
    outcome = resume(tmp_path, comm, fresh, fresh_opt, fresh_sched, io_threads=2)
    assert outcome.restored is not None and not outcome.skipped
    for k, v in model.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k])
    for p_old, p_new in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p_old][key], fresh_opt.state[p_new][key])
    assert fresh_sched.state_dict() == sched.state_dict()
    # Every rank derives its shard plan from this order, so it must not depend on load order.
    assert list(optimizer_tensors(fresh_opt, param_names(fresh))) == list(optimizer_tensors(opt, names))
