"""A node-local hot tier (`checkpoint.hot_dir=.../%n`) in real processes (gloo): four FSDP2 ranks on
two "nodes" each write into their node's own directory, and every node's files are copied over the
network to its buddy. Then one node's directory is deleted (the node died with its disk) and two
ranks on the surviving node and a fresh one resume the exact values: from the buddy copy and from
the other node, each file checked against the manifest. With the buddy copy gone too, the step is
incomplete and the resume falls back to the one before it.

The node names are given to each process (RankInfo.node) rather than taken from Slurm; everything
else (the save protocol, the transfers, the load) is what a job runs."""

import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.config import CheckpointConfig, ClusterConfig, Config, ModelConfig
from resilient_slurm.ledger import EventLog, read_events
from resilient_slurm.parallel import fsdp
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.model.decoder import token_loss_sum
from tests.ports import free_port
from tests.sharded_reference import assert_holds_reference_rows, write_reference

pytestmark = pytest.mark.slow

MODEL = ModelConfig(vocab_size=515, hidden_size=66, intermediate_size=128, num_layers=2, num_heads=3,
                    num_kv_heads=1, max_seq_len=32)


def _setup(rank, world, port, nodes, tmp, seed):
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port, nodes[rank]))
    cfg = Config(model=MODEL)
    model = fsdp.build_model(MODEL, comm.mesh, comm.device)
    fsdp.fill_random(model, MODEL, seed)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, 10)
    run_dir = Path(tmp) / "exp" / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(run_dir, CheckpointConfig(hot_dir=f"{tmp}/hot/%n", io_threads=2), ClusterConfig(), comm,
                        EventLog(run_dir / "events.jsonl", rank=rank))
    return comm, model, optimizer, scheduler, ckpt


def _save(rank, world, port, nodes, tmp):
    comm, model, optimizer, scheduler, ckpt = _setup(rank, world, port, nodes, tmp, seed=1)
    g = torch.Generator().manual_seed(7 + rank)
    for step in (1, 2):
        ids = torch.randint(0, MODEL.vocab_size, (2, 16), generator=g)
        token_loss_sum(model(ids[:, :-1]), ids[:, 1:]).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        # step 1 in the background (buddy copies on the save's thread), step 2 synchronously
        ckpt.save(step, capture_snapshot(model, optimizer, scheduler, TrainState(step=step)), "periodic" if step == 1 else
                  "pause")
        ckpt.saver.wait()
    write_reference(model, optimizer, rank, tmp)
    ckpt.close()
    comm.close()


def _resume(rank, world, port, nodes, tmp, expect_step, expect_source):
    comm, model, optimizer, scheduler, ckpt = _setup(rank, world, port, nodes, tmp, seed=99)
    outcome = ckpt.resume(model, optimizer, scheduler)
    assert outcome.restored is not None, outcome.skipped
    got = (outcome.restored.train_state.step, outcome.restored.source)
    assert got == (expect_step, expect_source), (got, outcome.skipped)
    if expect_step == 2:
        assert_holds_reference_rows(model, optimizer, tmp)
    ckpt.close()
    comm.close()


def _run(fn, nodes, tmp, *args):
    mp.spawn(fn, args=(len(nodes), free_port(), nodes, str(tmp), *args), nprocs=len(nodes), join=True)


def run_root(tmp, node):
    return tmp / "hot" / node / "exp" / "run"


def test_a_node_local_checkpoint_survives_the_loss_of_a_node_through_its_buddy_copy(tmp_path):
    _run(_save, ("a", "a", "b", "b"), tmp_path)
    a, b = run_root(tmp_path, "a"), run_root(tmp_path, "b")
    for root in (a, b):
        assert (root / "step_00000002" / "manifest.json").is_file()
    # each node wrote its ranks' rows; the other node keeps a copy of them
    mine_a = sorted(p.name for p in (a / "step_00000002").glob("*.safetensors"))
    mine_b = sorted(p.name for p in (b / "step_00000002").glob("*.safetensors"))
    assert mine_a and mine_b and not set(mine_a) & set(mine_b)
    assert sorted(p.name for p in (b / ".buddy" / "a" / "step_00000002").glob("*.safetensors")) == mine_a
    assert sorted(p.name for p in (a / ".buddy" / "b" / "step_00000002").glob("*.safetensors")) == mine_b
    copies = [e for e in read_events(tmp_path / "exp" / "run" / "events.jsonl") if e.kind.value == "buddy_copy"]
    assert len(copies) == 2 and all(c.details.ok and c.details.bytes > 0 for c in copies)

    shutil.rmtree(tmp_path / "hot" / "a")  # node a died with its disk
    # two ranks (half the world: each needs two old ranks' rows) on node b and a fresh node c
    _run(_resume, ("b", "c"), tmp_path, 2, "buddy")
    assert (run_root(tmp_path, "c") / "step_00000002" / "manifest.json").is_file()

    # the resume brought a's files to b's own step directory: take every copy of one of them away,
    # and the newest complete checkpoint is step 1
    shutil.rmtree(b / ".buddy" / "a" / "step_00000002")
    shutil.rmtree(run_root(tmp_path, "c"))
    (b / "step_00000002" / mine_a[0]).unlink()
    _run(_resume, ("b", "b"), tmp_path, 1, "buddy")
