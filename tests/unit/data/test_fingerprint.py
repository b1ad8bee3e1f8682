"""Data fingerprints: cheap at any size (sampled blocks), yet they see a file replaced, grown or
rewritten in place; and the run takes them on one rank only."""

import os

import pytest

from resilient_slurm.data import fingerprint as fp
from resilient_slurm.data.fingerprint import DataChangedError, check_unchanged, file_fingerprint, fingerprint


def test_a_large_file_is_fingerprinted_from_a_megabyte_of_samples(tmp_path, monkeypatch):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB, sparse
    read = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: read.append(n) or real(fd, n, off))
    file_fingerprint(str(big))
    assert sum(read) == (fp.SAMPLES + 2) * fp.BLOCK


@pytest.mark.parametrize("change", ["append", "rewrite_middle", "truncate"])
def test_each_kind_of_change_is_seen(tmp_path, change):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"x" * (5 << 20))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = fingerprint([str(path)])
    with open(path, "r+b") as f:
        if change == "append":
            f.seek(0, 2)
            f.write(b"y")
        elif change == "rewrite_middle":  # between the samples, but the mtime moves
            f.seek((5 << 20) // 2 + 12345)
            f.write(b"y")
        else:
            f.truncate(4 << 20)
    with pytest.raises(DataChangedError, match=f"data file {path} changed since this run started"):
        check_unchanged(before.to_record(), fingerprint([str(path)]))


def test_an_unchanged_file_passes_and_a_small_one_is_read_whole(tmp_path):
    path = tmp_path / "small.jsonl"
    path.write_text('{"text": "a"}\n')
    first = fingerprint([str(path)])
    check_unchanged(first.to_record(), fingerprint([str(path)]))
    path.write_text('{"text": "b"}\n')
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))
    assert fingerprint([str(path)]).digest != first.digest


def test_only_rank_0_reads_the_samples(tmp_path, monkeypatch):
    """Rank 1 of a run takes rank 0's fingerprint (the collective is a stand-in that hands rank 0's
    value to every rank, as all_gather_object does)."""
    from resilient_slurm.config import Config
    from resilient_slurm.data import open as data_open

    class Rank1:
        rank, world_size = 1, 2

        @staticmethod
        def all_gather_object(obj):
            return [fingerprint([str(path)]), obj]

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(f'{{"prompt": "hi {i}", "completion": "there {i}"}}\n' for i in range(40)))
    calls = []
    monkeypatch.setattr(data_open, "fingerprint", lambda files: calls.append(files) or pytest.fail("rank 1 hashed"))
    cfg = Config()
    cfg.data.path, cfg.data.cache_dir, cfg.data.val_samples = str(path), str(tmp_path / "cache"), 10
    data = data_open.open_data(cfg, tmp_path, Rank1())
    assert data.fingerprint.files == {str(path): file_fingerprint(str(path))} and not calls
