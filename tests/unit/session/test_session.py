"""The Session's edges, as a user's loop meets them (issue 27, items 1-7), on one rank in this process:
a loop that forgets `end_of_step`, a model changed since its checkpoint, the loop's own seeding,
metrics and data positions that are tensors or numpy numbers, a data object that cannot be saved,
and the step line and total a loop of its own gets. Real checkpoints on disk; nothing is faked."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from resilient_slurm.analysis.report import render
from resilient_slurm.analysis.summary import load, summarize
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.load import CheckpointRefused
from resilient_slurm.config import Config
from resilient_slurm.errors import InputError, exit_code_for
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.prepare import prepare
from resilient_slurm.ledger import Kind, read_events
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.session.distributed import RankInfo
from resilient_slurm.session.context import RankContext, launched
from resilient_slurm.session.session import Session
from tests.single_rank import one_rank


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    one_rank()  # the process group the sessions adopt
    c = Config()
    c.run.root, c.run.name, c.entry = str(tmp_path), "loop", "tests.unit.session:loop"
    c.tracking.mode = "disabled"
    c.monitor.enabled = False
    c.checkpoint.async_save = False
    c.train.max_steps = 300  # the project's default: a loop of its own says its own total
    return c


def session(cfg: Config, model: nn.Module, optimizer=None, data_state=None, stop: StopRequest | None = None):
    """A Session as an `entry=` function gets it, and where it leaves how the rank ended."""
    run_dir = prepare(cfg, [])[0] if not (Path(cfg.run.root) / cfg.run.experiment / cfg.run.name).exists() else \
        Path(cfg.run.root) / cfg.run.experiment / cfg.run.name
    ctx = RankContext(cfg, run_dir, RankInfo(0, 1, 0, "127.0.0.1", 0), stop or StopRequest())
    with launched(ctx):
        return Session.from_env(model, optimizer, None, data_state), ctx


def train(s: Session, steps: int, every_step=lambda step: None) -> None:
    with s:
        s.resume()
        for step in s.steps(steps):
            every_step(step)
            s.log(step, loss=1.0 / step)
            if s.end_of_step(step):
                break


def checkpoints(cfg: Config) -> Path:
    return Path(cfg.run.root) / cfg.run.experiment / cfg.run.name / "checkpoints"


def kinds(cfg: Config) -> list[Kind]:
    return [e.kind for e in read_events(Path(cfg.run.root) / cfg.run.experiment / cfg.run.name / "events.jsonl")]


# --- 1. a loop that never calls end_of_step -------------------------------------------------------
def test_a_loop_that_never_ends_a_step_is_refused_at_its_second_step_and_nothing_finishes(cfg):
    s, ctx = session(cfg, nn.Linear(4, 4))
    with pytest.raises(InputError) as err:
        with s:
            s.resume()
            for step in s.steps(5):
                s.log(step, loss=1.0)
    assert str(err.value).startswith("s.steps reached step 2 before s.end_of_step(1): call s.end_of_step(step)")
    assert "\n" not in str(err.value) and ctx.outcomes[0].code == ExitCode.CONFIG
    assert Kind.FINISH not in kinds(cfg) and not list(checkpoints(cfg).glob("step_*"))


def test_a_loop_of_its_own_steps_that_only_logs_is_refused_at_the_second_log(cfg):
    s, _ = session(cfg, nn.Linear(4, 4))
    with pytest.raises(InputError, match=r"^s.log reached step 2 before s.end_of_step\(1\)"):
        with s:
            for step in range(1, 4):
                s.log(step, loss=1.0)


def test_a_one_step_loop_without_end_of_step_is_refused_at_its_end_not_finished(cfg):
    s, ctx = session(cfg, nn.Linear(4, 4))
    with pytest.raises(InputError, match=r"^the loop ran to step 1 without calling s.end_of_step\(step\)"):
        with s:
            s.resume()
            for step in s.steps(1):
                s.log(step, loss=1.0)
    assert ctx.outcomes[0].code == ExitCode.CONFIG and Kind.FINISH not in kinds(cfg)


# --- 2. a changed model is the user's mistake, damaged storage is not ------------------------------
def test_a_model_whose_shape_changed_is_refused_in_one_line_and_nothing_is_moved_aside(cfg):
    torch.manual_seed(0)
    train(session(cfg, nn.Linear(4, 8))[0], 2)
    saved = sorted(p.name for p in checkpoints(cfg).glob("step_*"))
    s, ctx = session(cfg, nn.Linear(4, 16))
    with pytest.raises(CheckpointRefused) as err:
        train(s, 4)
    line = str(err.value)
    assert "tensor 'weight' is [8, 4] in the checkpoint and [16, 4] in this model" in line and "\n" not in line
    assert "start a new run" in line and exit_code_for(err.value) == ExitCode.CONFIG
    assert ctx.outcomes[0].code == ExitCode.CONFIG
    assert sorted(p.name for p in checkpoints(cfg).glob("step_*")) == saved == ["step_00000002"]
    assert not (checkpoints(cfg) / layout.QUARANTINE_DIR).exists()


def test_other_parameter_groups_are_a_changed_run_too(cfg):
    model = nn.Linear(4, 4)
    one = torch.optim.AdamW(model.parameters())

    def step(n: int) -> None:
        model(torch.ones(2, 4)).sum().backward()
        one.step()

    train(session(cfg, model, one)[0], 1, every_step=step)
    two = torch.optim.AdamW([{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}])
    with pytest.raises(CheckpointRefused, match="kept 'weight' and 'bias' in one parameter group, and this run's puts "
                                                 r"them in groups of different weight_decay \(0.01 and 0.0\)"):
        train(session(cfg, model, two)[0], 2)
    assert not (checkpoints(cfg) / layout.QUARANTINE_DIR).exists()


def test_a_damaged_checkpoint_is_still_moved_aside_and_the_one_before_loaded(cfg):
    cfg.checkpoint.every_steps = 1
    train(session(cfg, nn.Linear(4, 8))[0], 2)
    (tensors,) = (checkpoints(cfg) / "step_00000002").glob("model*.safetensors")
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF  # a bit flip on disk
    tensors.write_bytes(bytes(data))
    s, _ = session(cfg, nn.Linear(4, 8))
    with s:
        restored = s.resume()
        assert restored is not None and restored.step == 1
        s.end_of_step(2)
    assert [p.name.split(".")[0] for p in (checkpoints(cfg) / layout.QUARANTINE_DIR).iterdir()] == ["step_00000002"]


# --- 3. the loop's own seeding stands -------------------------------------------------------------
def test_a_fresh_start_leaves_the_loops_own_seeds_and_a_resume_restores_the_saved_states(cfg):
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    want = (torch.rand(3), random.random(), np.random.rand())
    model = nn.Linear(4, 4)  # its initialisation draws from torch's generator too
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    s, _ = session(cfg, model)
    draws = []
    train(s, 2, every_step=lambda step: draws.append((torch.rand(3), random.random(), np.random.rand())))
    assert torch.equal(draws[0][0], want[0]) and draws[0][1:] == want[1:]
    after = torch.rand(3)  # what the loop draws next, from the state the final save captured

    model = nn.Linear(4, 4)
    torch.manual_seed(99)
    s, _ = session(cfg, model)
    with s:
        assert s.resume() is not None
        assert torch.equal(torch.rand(3), after)


# --- 4. metrics: tensors and numpy numbers taken, anything else named ------------------------------
def test_log_takes_0_dim_tensors_and_numpy_numbers_and_names_anything_else(cfg):
    s, _ = session(cfg, nn.Linear(4, 4))
    with pytest.raises(InputError) as err:
        with s:
            s.log(1, loss=torch.tensor(2.5, requires_grad=True) * 1, acc=np.float32(0.5), seen=np.int64(3))
            s.end_of_step(1)
            s.log(2, hist=torch.ones(3))
    assert str(err.value) == ("s.log(step 2, ...): metric 'hist' is a torch.Tensor of shape [3], which metrics.jsonl "
                              "cannot hold; log a number or a string (a tensor's .item())")
    rows = [json.loads(line) for line in (s.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["acc"], r["seen"]) for r in rows] == [(1, 2.5, 0.5, 3)]


# --- 5. a data position of numpy numbers saves, in the emergency save too ---------------------------
class NumpyPosition:
    def __init__(self) -> None:
        self.batch, self.order = np.int64(0), np.arange(3, dtype=np.int32)

    def state_dict(self) -> dict:
        return {"batch": self.batch, "order": list(self.order), "rate": np.float32(0.5)}

    def load_state_dict(self, state: dict) -> None:
        self.batch, self.order = np.int64(state["batch"]), np.array(state["order"], dtype=np.int32)


def test_a_data_position_of_numpy_numbers_is_saved_by_the_emergency_save(cfg):
    stop, position = StopRequest(), NumpyPosition()

    def step(n: int) -> None:
        position.batch += 1
        if n == 2:
            stop.request("a test's stop")

    s, ctx = session(cfg, nn.Linear(4, 4), data_state=position, stop=stop)
    with pytest.raises(SystemExit) as exited:
        train(s, 5, every_step=step)
    assert exited.value.code == ExitCode.RESUME and ctx.outcomes[0].code == ExitCode.RESUME
    saved = json.loads((checkpoints(cfg) / "step_00000002" / layout.TRAIN_STATE).read_text())
    assert saved["reason"] == "emergency" and saved["data_state"] == {"batch": 2, "order": [0, 1, 2], "rate": 0.5}
    again = NumpyPosition()
    s, _ = session(cfg, nn.Linear(4, 4), data_state=again)
    with s:
        s.resume()
        assert again.batch == 2
        s.end_of_step(3)


def test_a_data_position_json_cannot_hold_is_refused_when_registered(cfg):
    with pytest.raises(InputError) as err:
        session(cfg, nn.Linear(4, 4), data_state={"seen": {1, 2}})
    assert str(err.value) == ("data_state['seen'] is a set, which train_state.json cannot hold; keep the data "
                              "position to numbers, strings, lists and dicts")


# --- 6. a data object without state_dict ----------------------------------------------------------
def test_a_data_object_without_state_dict_is_refused_when_registered(cfg):
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(InputError) as err:
        session(cfg, nn.Linear(4, 4), data_state=loader)
    line = str(err.value)
    assert line.startswith("data_state: a torch.DataLoader has no state_dict() and no load_state_dict(); register")
    assert "\n" not in line


# --- 7. a loop of its own prints the step line, and the report knows its total ----------------------
def test_a_loop_prints_the_step_line_of_what_it_logs_and_the_report_says_its_total(cfg, caplog):
    cfg.train.log_every_steps = 2
    s, _ = session(cfg, nn.Linear(4, 4))
    with caplog.at_level(logging.INFO, logger="resilient_slurm"), s:
        s.resume()
        for step in s.steps(3):
            s.log(step, loss=torch.tensor(2.0), acc=0.5, tokens=100)
            s.end_of_step(step)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" | tok/s")[0].rsplit(" | ", 1)[0] for line in lines] == \
        ["step 1/3 | loss 2.0000 | acc 0.5", "step 2/3 | loss 2.0000 | acc 0.5"]
    assert all(line.endswith(" tok/s") for line in lines)
    assert "finished at step 3/3" in render(summarize(load(s.run_dir)))


# --- the narrow face --------------------------------------------------------------------------------
LOOP_FACE = {"from_env", "resume", "steps", "log", "end_of_step", "save", "close", "rank", "world_size", "device",
             "step", "model", "optimizer", "scheduler", "run_dir", "paths"}
TRAINER_SIDE = {"start", "sync", "advance", "after_step", "commit", "finish", "rollback", "announce", "beat", "track",
                "saved", "committed_step", "checkpoint_root", "config_hash", "gpu", "sections", "replay_fallback",
                "speaks", "leads", "adopt", "resumed_at", "heal_snapshot"}


def test_the_session_shows_a_loop_its_face_and_the_trainer_its_side_and_nothing_else(cfg):
    s, _ = session(cfg, nn.Linear(4, 4))
    public = {n for n in dir(s) if not n.startswith("_")}
    assert public == LOOP_FACE | TRAINER_SIDE
    s.close(ExitCode.DONE)
