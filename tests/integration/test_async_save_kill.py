"""SIGKILL at random moments while async saves run in the background: every checkpoint that is
visible afterwards verifies, and holds the state of its own step even though the live tensors were
overwritten while it was being written."""

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.checkpoint import store
from resilient_slurm.checkpoint.async_save import AsyncSaver
from resilient_slurm.checkpoint.state import Snapshot, held
from resilient_slurm.checkpoint.verify import verify
from tests.single_rank import one_rank

pytestmark = pytest.mark.slow


def _train_and_save_forever(root: str) -> None:
    torch.set_num_threads(1)
    saver = AsyncSaver(Path(root), one_rank(), max_shard_bytes=8 << 20, io_threads=2)
    model = {f"layer{i}.weight": torch.empty(512, 1024) for i in range(8)}  # 16 MB
    optim = {f"layer{i}.weight.exp_avg": torch.empty(512, 1024) for i in range(8)}
    step = max([s for s, _ in store.list_step_dirs(Path(root))], default=0)
    while True:
        step += 1
        saver.wait()  # at most one save in flight
        for t in model.values():
            t.fill_(step)
        for t in optim.values():
            t.fill_(-step)
        snap = Snapshot({k: held(v, k) for k, v in model.items()}, {k: held(v, k) for k, v in optim.items()},
                        rng={"step": step}, json_files={"train_state.json": {"step": step}})
        saver.save(step, snap, lambda _result, _error, _blocking: None)
        # Training goes on at once and changes the live state while the save is being written.
        for t in [*model.values(), *optim.values()]:
            t.fill_(float("nan"))


def test_sigkill_during_async_saves_leaves_only_valid_checkpoints_of_their_own_step(tmp_path):
    root = tmp_path / "ckpts"
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(4321)
    kill = 0
    deadline = time.monotonic() + 240
    # 20 kills, and more while fewer than 5 saves committed (a loaded machine saves slower).
    while kill < 20 or len(store.list_step_dirs(root)) < 5:
        assert time.monotonic() < deadline, "the saver never got far enough to test anything"
        kill += 1
        proc = ctx.Process(target=_train_and_save_forever, args=(str(root),))
        proc.start()
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        for step, path in store.list_step_dirs(root):
            verdict = verify(path)
            assert verdict.ok, f"after kill {kill}: {path.name} is visible but invalid: {verdict.reason}"
            assert verdict.manifest.step == step
        newest = store.list_step_dirs(root)[:1]
        for step, path in newest:
            for f in path.glob("*.safetensors"):
                for name, t in load_file(f).items():
                    expected = -step if "exp_avg" in name else step
                    assert torch.all(t == expected), f"{path.name}/{f.name}:{name} holds another step's values"
