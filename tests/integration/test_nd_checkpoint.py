"""A user's own loop with tensor parallelism (torchtitan-style: `parallelize_module` with colwise and
rowwise layers, then `fully_shard` over the data-parallel dimension of a 2-D mesh), checkpointed by
the Session, then resumed at other layouts: FSDP(4), one rank without any DTensor, HSDP 2x2. Each
resume holds exactly the values the previous layout saved (model and AdamW state, bit-equal), and
the 2-D save's chunks are the ones torch.distributed.checkpoint makes of the same state.

Four gloo ranks, a model of a few hundred parameters with uneven cuts (10 rows over tp=2 and dp=2:
3, 2, 3, 2; a bias replicated over tp).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from resilient_slurm.api import Session
from resilient_slurm.config import CheckpointConfig, Config, MonitorConfig, RunConfig, TrackingConfig
from resilient_slurm.launch.prepare import prepare
from tests.ports import free_port

pytestmark = pytest.mark.slow


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 10)
        self.down = nn.Linear(10, 6)
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) * self.scale


def _build(layout: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Tiny()
    if layout == "dp2xtp2":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    elif layout == "fsdp4":
        fully_shard(model, mesh=init_device_mesh("cpu", (4,)))
    elif layout == "hsdp2x2":
        fully_shard(model, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every value whole, by name (collective for DTensors)."""
    out = {f"model/{n}": _full(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for key, value in opt.state[p].items():
            out[f"optim/{n}.{key}"] = _full(value)
    return out


def _loop(rank: int, world: int, port: int, run_dir: str, layout: str, steps: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, opt = _build(layout)
    g = torch.Generator().manual_seed(rank)
    with Session.from_env(model, opt, run_dir=run_dir) as s:
        resumed = s.resume()
        if resumed is not None:
            state = _state(model, opt)
            if rank == 0:
                ref = torch.load(Path(out) / "before.pt")
                assert state.keys() == ref.keys(), (sorted(state), sorted(ref))
                for k, v in ref.items():
                    assert torch.equal(state[k], v), k
                (Path(out) / f"resumed-{layout}").write_text(str(resumed.step))
        for step in s.steps(steps):
            loss = model(torch.randn(4, 8, generator=g)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log(step, loss=loss.item())
            s.end_of_step(step)
        state = _state(model, opt)  # what the final save holds
        if rank == 0:
            torch.save(state, Path(out) / "before.pt")
    if layout == "dp2xtp2":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(Path(out) / "dcp"))
    dist.destroy_process_group()


def _run(world: int, run_dir: Path, layout: str, steps: int, out: Path) -> None:
    mp.spawn(_loop, args=(world, free_port(), str(run_dir), layout, steps, str(out)), nprocs=world, join=True)


def test_a_tensor_parallel_loop_resumes_bit_equal_at_every_other_layout(tmp_path):
    cfg = Config(run=RunConfig(root=str(tmp_path / "runs"), experiment="nd", name="tp"),
                 checkpoint=CheckpointConfig(every_steps=1, io_threads=2), monitor=MonitorConfig(enabled=False),
                 tracking=TrackingConfig(mode="disabled"))
    run_dir, _ = prepare(cfg, [])
    _run(4, run_dir, "dp2xtp2", 2, tmp_path)
    ckpt = run_dir / "checkpoints" / "step_00000002"
    index = json.loads((ckpt / "model.shards.json").read_text())["tensors"]
    # Colwise up.weight under FSDP2: 10 rows cut by tp, then dp (3, 2 | 3, 2): four boxes, one writer each.
    assert sorted((c[1], c[2]) for c in index["up.weight"]["chunks"]) == [
        ([0, 0], [3, 8]), ([3, 0], [2, 8]), ([5, 0], [3, 8]), ([8, 0], [2, 8])]
    # Rowwise down.weight: dp rows x tp columns.
    assert sorted((c[1], c[2]) for c in index["down.weight"]["chunks"]) == [
        ([0, 0], [3, 5]), ([0, 5], [3, 5]), ([3, 0], [3, 5]), ([3, 5], [3, 5])]
    # down.bias and scale are replicated over tp: each box is held twice and written once.
    assert sorted(c[1] for c in index["down.bias"]["chunks"]) == [[0], [3]]

    # The same state through DCP: the same chunks, tensor by tensor.
    meta = dcp.FileSystemReader(str(tmp_path / "dcp")).read_metadata().state_dict_metadata
    optim = json.loads((ckpt / "optimizer.shards.json").read_text())["tensors"]
    for name, t in [*index.items(), *optim.items()]:
        key = f"model.{name}" if name in index else f"optim.state.{name}"
        theirs = sorted((list(c.offsets), list(c.sizes)) for c in meta[key].chunks)
        assert sorted((c[1], c[2]) for c in t["chunks"]) == theirs, name

    for world, layout, steps in [(4, "fsdp4", 3), (1, "plain", 4), (4, "hsdp2x2", 5)]:
        _run(world, run_dir, layout, steps, tmp_path)
        assert (tmp_path / f"resumed-{layout}").read_text() == str(steps - 1)
