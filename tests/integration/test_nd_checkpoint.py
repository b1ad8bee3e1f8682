"""A user's own loop with tensor parallelism (torchtitan-style: `parallelize_module` with colwise and
rowwise layers, then `fully_shard` over the data-parallel dimension of a 2-D mesh), checkpointed by
the Session, then resumed at other layouts: FSDP(4), one rank without any DTensor, HSDP 2x2. Each
resume holds exactly the values the previous layout saved (model and AdamW state, bit-equal), and
the 2-D save's chunks are the ones torch.distributed.checkpoint makes of the same state.

Pipeline stages: ranks that hold different tensors (and param groups of different parameters) save
together, and resume at another cut: 2 stages -> 1 rank -> 2 stages cut elsewhere.

DCP both ways, at a layout that did not save: the 2-D checkpoint converted to DCP is read by
`dcp.load` into FSDP(4); DCP's own 2-D save of the same state, converted to ours, is read by our
loader into FSDP(4).

Four gloo ranks, a model of a few hundred parameters with uneven cuts (10 rows over tp=2 and dp=2:
3, 2, 3, 2; a bias replicated over tp).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from resilient_slurm.api import Session
from resilient_slurm.checkpoint.__main__ import main
from resilient_slurm.checkpoint.load import load_into, resume
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import CheckpointConfig, Config, MonitorConfig, RunConfig, TrackingConfig
from resilient_slurm.launch.prepare import prepare
from resilient_slurm.session.distributed import Comm, RankInfo
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


def _converted_both_ways(rank: int, out: Path) -> None:
    """At FSDP(4): DCP's reader on our converted checkpoint, ours on DCP's converted save."""
    saved = torch.load(out / "dp2xtp2.pt")
    model, _ = _build("fsdp4")
    state = get_model_state_dict(model)
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(out / "ours-as-dcp")))
    ours = {f"model/{n}": _full(t) for n, t in state.items()}
    model, _ = _build("fsdp4")
    path = out / "dcp-as-ours"
    load_into(path, verify(path).manifest, rank, model, None, None, 2)
    theirs = {f"model/{n}": _full(p) for n, p in model.named_parameters()}
    for got in (ours, theirs):
        assert got.keys() == {k for k in saved if k.startswith("model/")}
        assert all(torch.equal(v, saved[k]) for k, v in got.items())


def _loop(rank: int, world: int, port: int, run_dir: str, layout: str, steps: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if layout == "fsdp4":
        _converted_both_ways(rank, Path(out))
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

    shutil.copy(tmp_path / "before.pt", tmp_path / "dp2xtp2.pt")
    assert main(["convert", str(run_dir), str(tmp_path / "ours-as-dcp"), "--to", "dcp"]) == 0
    assert main(["convert", str(tmp_path / "dcp"), str(tmp_path / "dcp-as-ours"), "--to", "native",
                 "--prefix", "model."]) == 0

    for world, layout, steps in [(4, "fsdp4", 3), (1, "plain", 4), (4, "hsdp2x2", 5)]:
        _run(world, run_dir, layout, steps, tmp_path)
        assert (tmp_path / f"resumed-{layout}").read_text() == str(steps - 1)


# --- pipeline stages: ranks hold different tensors ----------------------------------------------------------------
SPLITS = {  # which layers each rank's stage holds
    "two stages": [["layers.0", "layers.1"], ["layers.2", "norm"]],
    "one rank": [["layers.0", "layers.1", "layers.2", "norm"]],
    "other cut": [["layers.0"], ["layers.1", "layers.2", "norm"]],
}


def _stage(parts: list[str]) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A stage as torchtitan cuts one: the whole model's names, the other stages' modules left out."""
    torch.manual_seed(1)
    full = nn.ModuleDict({"layers": nn.ModuleDict({str(i): nn.Linear(6, 6) for i in range(3)}), "norm": nn.LayerNorm(6)})
    for i in range(3):
        if f"layers.{i}" not in parts:
            del full["layers"][str(i)]
    if "norm" not in parts:
        del full["norm"]
    # Two param groups, as a weight-decay split makes them: each stage has both, with its own parameters.
    decay = [p for n, p in full.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in full.named_parameters() if not n.endswith("weight")]
    return full, torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=0.1)


def _stages(rank: int, world: int, port: int, root: str, split: str, step: int) -> None:
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
    model, opt = _stage(SPLITS[split][rank])
    restored = resume(Path(root), comm, model, opt, None, io_threads=2).restored
    if restored is not None:
        want = torch.load(Path(root) / "values.pt")
        for n, p in model.named_parameters():
            assert torch.equal(p.detach(), want[n]), n
            for key, value in opt.state[p].items():
                assert torch.equal(value, want[f"{n}.{key}"]), (n, key)
        assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 0.1 * (i + 1 + step))
    opt.step()
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    values |= {f"{n}.{k}": v.clone() for n, p in model.named_parameters() for k, v in opt.state[p].items()}
    everyone = comm.all_gather_object(values)
    save(Path(root), step, capture_snapshot(model, opt, None, TrainState(step=step)), comm, 1 << 30, 2)
    if rank == 0:
        torch.save({k: v for part in everyone for k, v in part.items()}, Path(root) / "values.pt")
    comm.close()


def test_pipeline_stages_save_what_each_holds_and_resume_at_any_cut(tmp_path):
    for step, split in enumerate(["two stages", "one rank", "other cut"], start=1):
        world = len(SPLITS[split])
        mp.spawn(_stages, args=(world, free_port(), str(tmp_path), split, step), nprocs=world, join=True)
    groups = json.loads((tmp_path / "step_00000001" / "optimizer.json").read_text())["param_groups"]
    # optimizer.json has every stage's groups, not rank 0's alone.
    assert sorted(n for g in groups for n in g["params"]) == sorted(
        f"{m}.{k}" for m in ("layers.0", "layers.1", "layers.2", "norm") for k in ("weight", "bias"))
