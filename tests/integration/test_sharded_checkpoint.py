"""Sharded checkpoints across world sizes, in real processes (gloo): N FSDP2 ranks each write only
their own rows; M ranks then restore exactly the saved model and optimizer values, each reading only
the byte ranges of its rows. 2 -> 1, 1 -> 2 and 2 -> 4. And `model.dcp`: a run's initial weights
from a torch.distributed.checkpoint directory under torchtitan's names, read at FSDP(2)."""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from resilient_slurm.checkpoint.load import load_into
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.config import Config, ModelConfig
from resilient_slurm.parallel import fsdp
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.model.decoder import plain_model, token_loss_sum
from resilient_slurm.trainer import build
from tests.ports import free_port
from tests.sharded_reference import assert_holds_reference_rows, write_reference
from tests.torchtitan_names import titan_state

pytestmark = pytest.mark.slow

# Rows that do not divide evenly over 4 ranks (vocab 8195, kv rows 86): the last shards are shorter.
# Large enough (22 MB of weights) that a file spans many CRC chunks, so reading part of one is possible.
MODEL = ModelConfig(vocab_size=8195, hidden_size=258, intermediate_size=512, num_layers=2, num_heads=3,
                    num_kv_heads=1, max_seq_len=32)


def _setup(rank: int, world: int, port: int, seed: int):
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
    cfg = Config(model=MODEL)
    model = fsdp.build_model(MODEL, comm.mesh, comm.device)
    fsdp.fill_random(model, MODEL, seed)
    optimizer = build_optimizer(model, cfg.optim)
    return comm, cfg, model, optimizer, build_scheduler(optimizer, cfg.optim, 10)


def _save(rank: int, world: int, port: int, root: str) -> None:
    comm, cfg, model, optimizer, scheduler = _setup(rank, world, port, seed=1)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(2):
        ids = torch.randint(0, MODEL.vocab_size, (2, 16), generator=g)
        token_loss_sum(model(ids[:, :-1]), ids[:, 1:]).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    snap = capture_snapshot(model, optimizer, scheduler, TrainState(step=2))
    save(Path(root), 2, snap, comm, max_shard_bytes=1 << 30, io_threads=2)
    write_reference(model, optimizer, rank, root)  # every value, gathered whole
    comm.close()


def _load(rank: int, world: int, port: int, root: str) -> None:
    comm, cfg, model, optimizer, scheduler = _setup(rank, world, port, seed=99)  # other weights, no state
    path = Path(root) / "step_00000002"
    restored = load_into(path, verify(path).manifest, rank, model, optimizer, scheduler, io_threads=2)
    assert_holds_reference_rows(model, optimizer, root)
    files = sum(e.nbytes for rel, e in verify(path).manifest.files.items() if rel.endswith(".safetensors"))
    saved_world = verify(path).manifest.world_size
    if world > saved_world:  # this rank reads its rows only: a fraction of the files, plus chunk rounding
        assert restored.bytes_read < files * 0.75, (restored.bytes_read, files)
    comm.close()


def _run(fn, world: int, root: Path) -> None:
    mp.spawn(fn, args=(world, free_port(), str(root)), nprocs=world, join=True)


@pytest.mark.parametrize("saved, loaded", [(2, 1), (2, 4), (1, 2)])
def test_a_checkpoint_of_n_ranks_restores_the_exact_values_on_m(tmp_path, saved, loaded):
    _run(_save, saved, tmp_path)
    written = sorted(p.name for p in (tmp_path / "step_00000002").glob("model*.safetensors"))
    assert len(written) == saved  # each rank wrote its own rows, no gather to rank 0
    _run(_load, loaded, tmp_path)


def _from_dcp(rank: int, world: int, port: int, root: str) -> None:
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
    cfg = Config(model=dataclasses.replace(MODEL, dcp=str(Path(root) / "dcp")))
    model = fsdp.build_model(MODEL, comm.mesh, comm.device)
    build.fill_initial(model, cfg)
    want = plain_model(MODEL, seed=3).state_dict()
    for name, p in model.named_parameters():
        # q_proj's 258 rows split 129/129 over the ranks: the cut falls inside a head of 86 rows.
        assert torch.equal(p.full_tensor(), want[name]), name
    comm.close()


def test_model_dcp_starts_a_sharded_run_from_torchtitan_weights(tmp_path):
    weights = titan_state(plain_model(MODEL, seed=3).state_dict(), MODEL.num_heads, MODEL.num_kv_heads)
    dcp.save(weights, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")), no_dist=True)
    _run(_from_dcp, 2, tmp_path)
