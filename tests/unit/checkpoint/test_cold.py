"""The cold tier over fsspec, on a local directory (a shared filesystem) and on S3 (moto)."""

import pytest

from resilient_slurm.checkpoint.cold import Cancelled, ColdTier, ColdTierError
from resilient_slurm.checkpoint.verify import verify
from tests.s3_server import s3_bucket


@pytest.fixture(scope="module")
def s3():
    with s3_bucket() as (_fs, url):
        yield url


@pytest.fixture(params=["local", "s3"])
def cold(request, tmp_path):
    url = str(tmp_path / "cold") if request.param == "local" else f"{request.getfixturevalue('s3')}/{tmp_path.name}"
    return ColdTier(url, threads=2)


def committed(cold: ColdTier, ckpt):
    verdict = verify(ckpt)
    cold.upload(ckpt, verdict.manifest, cancelled=lambda: False)
    return verdict.manifest


def test_a_copy_round_trips_byte_for_byte(cold, make_checkpoint, tmp_path):
    ckpt = make_checkpoint(step=7, max_shard_bytes=1 << 10)  # sharded: several files and an index
    manifest = committed(cold, ckpt)
    assert cold.steps() == [7]
    back = tmp_path / "back"
    assert cold.download(7, back) == manifest
    assert verify(back).ok
    for rel in manifest.files:
        assert (back / rel).read_bytes() == (ckpt / rel).read_bytes()


def test_a_copy_that_reads_back_wrong_is_never_committed(cold, make_checkpoint, monkeypatch):
    ckpt = make_checkpoint()
    real_put = cold.fs.put_file

    def corrupting_put(lpath, rpath, **kw):
        real_put(lpath, rpath, **kw)
        if rpath.endswith("model.safetensors"):
            cold.fs.pipe_file(rpath, b"\0" * cold.fs.size(rpath))

    monkeypatch.setattr(cold.fs, "put_file", corrupting_put)
    with pytest.raises(ColdTierError, match="model.safetensors reads back"):
        committed(cold, ckpt)
    assert cold.steps() == []


def test_a_damaged_cold_file_fails_the_download(cold, make_checkpoint, tmp_path):
    ckpt = make_checkpoint()
    committed(cold, ckpt)
    path = f"{cold.root}/step_00000001/model.safetensors"
    data = bytearray(cold.fs.cat_file(path))
    data[-3] ^= 0x01
    cold.fs.pipe_file(path, bytes(data))
    with pytest.raises(ColdTierError, match="checksum differs"):
        cold.download(1, tmp_path / "back")


def test_cancelled_or_unfinished_copies_are_invisible_and_replaced(cold, make_checkpoint):
    ckpt = make_checkpoint()
    with pytest.raises(Cancelled):
        cold.upload(ckpt, verify(ckpt).manifest, cancelled=lambda: True)
    cold.fs.makedirs(f"{cold.root}/step_00000001", exist_ok=True)
    cold.fs.pipe_file(f"{cold.root}/step_00000001/leftover.bin", b"x")  # an earlier copy that died
    assert cold.steps() == []
    committed(cold, ckpt)
    assert cold.steps() == [1]
    assert not cold.fs.exists(f"{cold.root}/step_00000001/leftover.bin")


def test_retention_operations(cold, make_checkpoint):
    for step in (1, 2):
        committed(cold, make_checkpoint(step=step))
    cold.strip_optimizer(2)
    assert not any(f.startswith("optimizer") for f in cold.manifest(2).files)
    assert not cold.fs.exists(f"{cold.root}/step_00000002/optimizer.safetensors")
    cold.delete(1)
    assert cold.steps() == [2]
