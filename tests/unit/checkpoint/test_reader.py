"""Reading any box of a saved tensor: overlaps that are one byte run go straight into the
destination, the others through bounded scratch; every byte checked against its chunk's CRC.
And version 2 checkpoints (pieces of rows) still load."""

import json
import zlib

import pytest
import torch

from resilient_slurm.checkpoint import reader as reader_module
from resilient_slurm.checkpoint.chunks import Box
from resilient_slurm.checkpoint.load import ModelChanged, load_into
from resilient_slurm.checkpoint.reader import LoadError, Reader, read_json, saved_tensors
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import Snapshot, capture_snapshot, held, optimizer_tensors, param_names
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.verify import verify
from tests.single_rank import one_rank
from tests.unit.checkpoint.tiny import trained

COMM = one_rank()
G = torch.Generator().manual_seed(0)
BIG = torch.randn(700, 600, generator=G)  # 1.7 MB: two CRC chunks
CUBE = torch.randn(6, 50, 40, generator=G)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tensors = {"big": BIG, "cube": CUBE}
    snap = Snapshot({n: held(t, n) for n, t in tensors.items()}, {}, {}, {"train_state.json": {"step": 1}})
    return save(tmp_path_factory.mktemp("c"), 1, snap, COMM, 1 << 30, 2).path


def read(path, name, box):
    manifest = verify(path, checksums=False).manifest
    docs = {rel: read_json(path, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    saved = saved_tensors(path, "model", manifest, docs)[name]
    dest = torch.empty(box.lengths)
    r = Reader(path, manifest, io_threads=2)
    r.add(name, saved, dest, box)
    r.run()
    return dest, r


@pytest.mark.parametrize("name, box, want", [
    ("big", Box((100, 0), (300, 600)), lambda: BIG[100:400]),             # rows: one run
    ("big", Box((0, 300), (700, 300)), lambda: BIG[:, 300:]),             # a column band: through scratch
    ("big", Box((650, 7), (50, 5)), lambda: BIG[650:, 7:12]),
    ("cube", Box((1, 10, 0), (2, 5, 40)), lambda: CUBE[1:3, 10:15]),
    ("cube", Box((0, 0, 39), (6, 50, 1)), lambda: CUBE[:, :, 39:]),
])
def test_any_box_reads_exactly_that_part_of_the_tensor(ckpt, name, box, want):
    got, r = read(ckpt, name, box)
    assert torch.equal(got, want())


def test_scratch_is_used_in_bounded_batches(ckpt, monkeypatch):
    monkeypatch.setattr(reader_module, "SCRATCH_BYTES", 64 << 10)
    got, r = read(ckpt, "big", Box((0, 1), (700, 2)))
    assert torch.equal(got, BIG[:, 1:3])
    pieces = r.files[next(iter(r.files))].pieces
    assert len(pieces) > 1 and all(p.nbytes <= 64 << 10 for p in pieces)


def test_a_flipped_byte_in_a_chunk_read_is_caught(tmp_path):
    snap = Snapshot({"big": held(BIG, "big")}, {}, {}, {"train_state.json": {"step": 1}})
    path = save(tmp_path, 1, snap, COMM, 1 << 30, 2).path
    with open(path / "model.safetensors", "r+b") as f:
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 1]))
    read(path, "big", Box((0, 0), (10, 600)))  # the first CRC chunk only: intact
    with pytest.raises(LoadError, match="checksum mismatch"):
        read(path, "big", Box((0, 599), (700, 1)))


def test_a_version_2_checkpoint_still_loads(tmp_path):
    model, opt, sched = trained(0)
    path = save(tmp_path, 1, capture_snapshot(model, opt, sched, TrainState(step=1)), COMM, 1 << 30, 2).path
    # What version 2 wrote: pieces of rows [file, start, stop] (a scalar's rows 0..1), and version 2 in the manifest.
    for prefix in ("model", "optimizer"):
        index_path = path / f"{prefix}.shards.json"
        index = json.loads(index_path.read_text())
        for t in index["tensors"].values():
            t["pieces"] = [[rel, o[0] if o else 0, o[0] + n[0] if n else 1] for rel, o, n in t.pop("chunks")]
        index_path.write_text(json.dumps(index))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["version"] = 2
    for prefix in ("model", "optimizer"):
        raw = (path / f"{prefix}.shards.json").read_bytes()
        manifest["files"][f"{prefix}.shards.json"] = {"bytes": len(raw), "crc32": f"{zlib.crc32(raw):08x}"}
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert verify(path).ok, verify(path).reason
    target, target_opt, target_sched = trained(5)
    load_into(path, verify(path).manifest, 0, target, target_opt, target_sched, io_threads=2)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in model.state_dict().items())
    want = optimizer_tensors(opt, param_names(model))
    got = optimizer_tensors(target_opt, param_names(target))
    assert all(torch.equal(got[n].data, h.data) for n, h in want.items())


def test_a_tensor_of_another_global_shape_is_refused_even_where_the_box_fits(tmp_path):
    import dataclasses

    from resilient_slurm.model.decoder import plain_model
    from tests.unit.checkpoint.tiny import TINY

    model, opt, sched = trained(0)
    path = save(tmp_path, 1, capture_snapshot(model, opt, sched, TrainState(step=1)), COMM, 1 << 30, 2).path
    smaller = plain_model(dataclasses.replace(TINY, vocab_size=48), 0)  # its rows all lie inside the saved 64
    with pytest.raises(ModelChanged, match=r"'model.embed_tokens.weight' is \[64, 32\] in the checkpoint and \[48, 32\]"):
        load_into(path, verify(path).manifest, 0, smaller, None, None, io_threads=1)


def test_a_version_1_checkpoint_still_loads_and_reads_in_boxes(tmp_path):
    model, opt, sched = trained(0)
    path = save(tmp_path, 1, capture_snapshot(model, opt, sched, TrainState(step=1)), COMM, 1 << 30, 2).path
    # What version 1 wrote: whole tensors in <prefix>.safetensors, no shards index, no chunk CRCs.
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["version"] = 1
    for prefix in ("model", "optimizer"):
        (path / f"{prefix}.shards.json").unlink()
        del manifest["files"][f"{prefix}.shards.json"]
    for entry in manifest["files"].values():
        entry.pop("chunks", None)
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert verify(path).ok, verify(path).reason
    target, target_opt, target_sched = trained(5)
    load_into(path, verify(path).manifest, 0, target, target_opt, target_sched, io_threads=2)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in model.state_dict().items())
    # a column band of one tensor, as a tensor-parallel rank reads it: the whole file is read and checked
    got, _ = read(path, "model.embed_tokens.weight", Box((0, 8), (64, 8)))
    assert torch.equal(got, model.state_dict()["model.embed_tokens.weight"][:, 8:16])


def test_a_large_version_1_file_without_chunk_crcs_is_read_whole_to_check_a_band_of_it(tmp_path):
    snap = Snapshot({"big": held(BIG, "big")}, {}, {}, {"train_state.json": {"step": 1}})
    path = save(tmp_path, 1, snap, COMM, 1 << 30, 2).path
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["version"] = 1
    (path / "model.shards.json").unlink()
    del manifest["files"]["model.shards.json"]
    manifest["files"]["model.safetensors"].pop("chunks")
    (path / "manifest.json").write_text(json.dumps(manifest))
    got, r = read(path, "big", Box((0, 100), (700, 3)))
    assert torch.equal(got, BIG[:, 100:103]) and r.bytes_read == (path / "model.safetensors").stat().st_size
