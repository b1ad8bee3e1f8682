from pathlib import Path

import pytest
import torch

from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import OptimizerGroup, Snapshot, held
from resilient_slurm.session.distributed import Comm
from tests.single_rank import one_rank


def snapshot(step: int = 1, seed: int = 0) -> Snapshot:
    g = torch.Generator().manual_seed(seed)
    model = {"model.embed_tokens.weight": torch.randn(64, 16, generator=g),
             "model.norm.weight": torch.randn(16, generator=g).bfloat16(),
             "lm_head.weight": torch.randn(64, 16, generator=g)}
    optim = {f"{k}.exp_avg": torch.randn(v.shape, generator=g) for k, v in model.items()}
    optim.update({f"{k}.step": torch.tensor(float(step)) for k in model})
    return Snapshot(model={k: held(v, k) for k, v in model.items()}, optimizer={k: held(v, k) for k, v in optim.items()},
                    rng={"python": [1, 2, 3]},
                    json_files={"train_state.json": {"step": step}, "scheduler.json": {"last_epoch": step}},
                    groups=(OptimizerGroup(tuple(model), {"lr": 0.1}),), optimizer_type="AdamW")


@pytest.fixture
def single_comm() -> Comm:
    return one_rank()


@pytest.fixture
def make_checkpoint(tmp_path: Path, single_comm: Comm):
    def make(step: int = 1, max_shard_bytes: int = 1 << 30, root: Path | None = None) -> Path:
        return save(root or tmp_path / "ckpts", step, snapshot(step), single_comm, max_shard_bytes, io_threads=2).path
    return make
