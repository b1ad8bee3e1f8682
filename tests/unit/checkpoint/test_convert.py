"""`convert` to torch.distributed.checkpoint and back, checked with DCP's own reader and writer
(`dcp.load`/`dcp.save` with FileSystemReader/FileSystemWriter) as the oracle; `model.dcp`'s fill of
a model from a DCP directory. One process, no process group: the multi-rank loads at other
layouts are in tests/integration/test_nd_checkpoint.py."""

import json
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from resilient_slurm.checkpoint import dcp_io
from resilient_slurm.checkpoint.chunks import Box
from resilient_slurm.checkpoint.__main__ import main
from resilient_slurm.checkpoint.convert import ConvertError, Heads, to_dcp, to_native
from resilient_slurm.checkpoint.load import load_into
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import capture_snapshot, held
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.verify import verify
from tests.torchtitan_names import titan_to_hf
from tests.torchtitan_names import titan_state as titan
from tests.unit.checkpoint.tiny import TINY, trained

HEADS = Heads(TINY.num_heads, TINY.num_kv_heads)
HEAD_DIM = TINY.hidden_size // TINY.num_heads


def titan_state(model):
    return titan(model.state_dict(), TINY.num_heads, TINY.num_kv_heads)


@pytest.fixture
def checkpoint(tmp_path, single_comm):
    model, opt, sched = trained(0)
    # Small files: several chunks per file set, so the chunk boxes survive the trip.
    result = save(tmp_path / "ckpts", 1, capture_snapshot(model, opt, sched, TrainState(step=1)), single_comm,
                  max_shard_bytes=4096, io_threads=2)
    return result.path, model


def dcp_load(path, shapes):
    """DCP's own reader: plain tensors of these shapes filled from `path`."""
    state = {k: torch.zeros(s) for k, s in shapes.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    return state


def test_to_dcp_with_our_names_loads_with_dcps_reader(tmp_path, checkpoint):
    path, model = checkpoint
    done = to_dcp(path, tmp_path / "dcp", "hf", None)
    want = model.state_dict()
    got = dcp_load(tmp_path / "dcp", {k: v.shape for k, v in want.items()})
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert done.tensors == len(want)


def test_to_dcp_with_torchtitan_names_is_what_torchtitans_adapter_maps_to_ours(tmp_path, checkpoint):
    path, model = checkpoint
    to_dcp(path, tmp_path / "dcp", "torchtitan", HEADS)
    titan = titan_state(model)
    got = dcp_load(tmp_path / "dcp", {k: v.shape for k, v in titan.items()})
    for k, v in titan.items():
        assert torch.equal(got[k], v), k
    # ... and the permutation is torchtitan's: its to_hf gives our q_proj back.
    assert torch.equal(titan_to_hf(got["layers.0.attention.wq.weight"], TINY.num_heads),
                       model.state_dict()["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize("names", ["hf", "torchtitan"])
def test_a_dcp_save_converted_to_ours_loads_the_same_weights(tmp_path, names):
    model, _, _ = trained(0)
    state = model.state_dict() if names == "hf" else titan_state(model)
    dcp.save({k: v.clone() for k, v in state.items()}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")),
             no_dist=True)
    done = to_native(tmp_path / "dcp", tmp_path / "step_00000007", None, HEADS, max_shard_bytes=4096)
    assert verify(tmp_path / "step_00000007").ok and done.tensors == len(state)
    other, opt, sched = trained(1)
    restored = load_into(tmp_path / "step_00000007", verify(tmp_path / "step_00000007").manifest, 0, other, opt, sched, 2)
    assert restored.train_state.step == 7 and not restored.has_optimizer
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k


def test_round_trip_ours_to_torchtitan_and_back_is_bit_equal(tmp_path, checkpoint):
    path, model = checkpoint
    to_dcp(path, tmp_path / "dcp", "torchtitan", HEADS)
    to_native(tmp_path / "dcp", tmp_path / "back", "torchtitan", HEADS)
    other, _, _ = trained(1)
    load_into(tmp_path / "back", verify(tmp_path / "back").manifest, 0, other, None, None, 2)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())


def test_model_dcp_fills_a_model_from_torchtitan_names(tmp_path):
    model, _, _ = trained(0)
    dcp.save({"model": titan_state(model)}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")), no_dist=True)
    other, _, _ = trained(1)
    assert dcp_io.fill_model(other, tmp_path / "dcp", TINY.num_heads, TINY.num_kv_heads) == "torchtitan"
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_dcp_directory_whose_chunks_do_not_cover_a_tensor_is_refused_naming_the_region(tmp_path):
    key = "model.embed_tokens.weight"
    w = torch.arange(24.0).view(4, 6)
    dcp_io.write_chunks(tmp_path / "dcp", [(key, (4, 6), torch.float32, Box((0, 0), (4, 3)), lambda: w[:, :3].contiguous()),
                                           (key, (4, 6), torch.float32, Box((0, 3), (4, 3)), lambda: w[:, 3:].contiguous())])
    # Leave the tensor without its second chunk, as a save that some ranks missed would.
    meta = pickle.loads((tmp_path / "dcp" / ".metadata").read_bytes())
    meta.state_dict_metadata[key].chunks.pop(1)
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(dcp_io.DcpError, match=r"tensor 'model.embed_tokens.weight': no chunk holds "
                                              r"\[0:4, 3:6\]: the checkpoint is incomplete"):
        to_native(tmp_path / "dcp", tmp_path / "out", None, None)
    assert not (tmp_path / "out").exists()


def test_cli_says_what_is_wrong_in_one_line_with_exit_2(tmp_path, checkpoint, capsys):
    path, _ = checkpoint
    assert main(["convert", str(tmp_path), str(tmp_path / "x"), "--to", "native"]) == 2
    assert main(["convert", str(path), str(tmp_path / "t"), "--to", "dcp", "--names", "torchtitan"]) == 2
    assert main(["convert", str(path), str(tmp_path / "ok"), "--to", "dcp"]) == 0
    assert main(["convert", str(path), str(tmp_path / "ok"), "--to", "dcp"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{tmp_path}: no .metadata: not a torch.distributed.checkpoint directory")
    assert "needs the model's head counts: pass --heads N --kv-heads M" in err[1]
    assert err[2] == f"convert: {tmp_path / 'ok'} exists and is not empty; choose a new directory"
    assert len(err) == 3


def test_convert_refuses_what_torchtitan_has_no_name_for(tmp_path, single_comm):
    model, opt, sched = trained(0)
    snap = capture_snapshot(model, opt, sched, TrainState(step=1))
    snap.model["model.extra.bias"] = held(torch.zeros(3), "model.extra.bias")
    path = save(tmp_path / "c", 1, snap, single_comm, 1 << 20, 1).path
    with pytest.raises(ConvertError, match="model.extra.bias has no torchtitan Llama-3 name"):
        to_dcp(path, tmp_path / "dcp", "torchtitan", HEADS)


def test_several_chunks_of_a_tensor_go_to_several_files(tmp_path):
    key = "model.embed_tokens.weight"
    w = torch.arange(24.0).view(4, 6)
    dcp_io.write_chunks(tmp_path / "dcp", [(key, (4, 6), torch.float32, Box((0, 0), (4, 3)), lambda: w[:, :3].contiguous()),
                                           (key, (4, 6), torch.float32, Box((0, 3), (4, 3)), lambda: w[:, 3:].contiguous())])
    to_native(tmp_path / "dcp", tmp_path / "out", None, None)
    assert verify(tmp_path / "out").ok
    index = json.loads((tmp_path / "out" / "model.shards.json").read_text())["tensors"][key]
    assert sorted((c[1], c[2]) for c in index["chunks"]) == [([0, 0], [4, 3]), ([0, 3], [4, 3])]
    assert len({c[0] for c in index["chunks"]}) == 2
