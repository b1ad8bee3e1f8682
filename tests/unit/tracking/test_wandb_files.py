"""Reading wandb's `.wandb` transaction log: LevelDB framing written here by hand (records split
across blocks, block padding, a torn tail), and files written by wandb itself."""

import struct
import zlib

import pytest

from resilient_slurm.tracking import wandb_files as wf

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def frame(payloads, tail=b""):
    """A transaction log as wandb-core writes one (header, then 32 KiB blocks of framed records)."""
    out = bytearray(wf.FILE_HEADER.pack(wf.FILE_IDENT, wf.FILE_MAGIC, wf.FILE_VERSION))

    def record(kind, data):
        out.extend(struct.pack("<IHB", zlib.crc32(data, zlib.crc32(bytes([kind]))), len(data), kind) + data)

    for data in payloads:
        left = wf.BLOCK - len(out) % wf.BLOCK
        if left < 7:
            out.extend(b"\0" * left)
            left = wf.BLOCK
        if len(data) + 7 <= left:
            record(wf.FULL, data)
            continue
        first, rest = data[: left - 7], data[left - 7 :]
        record(wf.FIRST, first)
        while len(rest) + 7 > wf.BLOCK:
            record(wf.MIDDLE, rest[: wf.BLOCK - 7])
            rest = rest[wf.BLOCK - 7 :]
        record(wf.LAST, rest)
    return bytes(out) + tail


def history_record(step, **values):
    r = pb.Record()
    r.history.step.num = step
    for k, v in values.items():
        item = r.history.item.add()
        item.key = k
        item.value_json = repr(v) if not isinstance(v, str) else f'"{v}"'
    return r.SerializeToString()


def test_records_across_blocks_and_padding_read_back(tmp_path):
    big = "x" * 70_000  # spans three blocks: FIRST, MIDDLE, LAST
    payloads = [history_record(1, loss=0.5), history_record(2, note=big)]
    payloads += [history_record(s, loss=1.0 / s) for s in range(3, 400)]
    path = tmp_path / "run-x.wandb"
    path.write_bytes(frame(payloads))
    rows = wf.history(path)
    assert [r.step for r in rows] == list(range(1, 400))
    assert rows[0].values == {"loss": 0.5} and rows[1].values["note"] == big


@pytest.mark.parametrize("cut", [1, 5, 9, 100])
def test_a_torn_tail_ends_the_history_at_the_last_whole_record(tmp_path, cut):
    data = frame([history_record(s, loss=float(s)) for s in range(1, 6)])
    path = tmp_path / "run-x.wandb"
    path.write_bytes(data[:-cut] if cut < 100 else data + b"\x13\x37" * 50)
    assert [r.step for r in wf.history(path)] == ([1, 2, 3, 4] if cut < 100 else [1, 2, 3, 4, 5])


def test_not_a_wandb_file(tmp_path):
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"hello world")
    with pytest.raises(wf.WandbFileError, match="not a wandb transaction log"):
        wf.history(path)


def test_segments_are_found_per_id_and_ordered_by_start_time(tmp_path):
    names = {"offline-run-20260102_000000-abc": "abc", "offline-run-20260101_235959-abc": "abc",
             "run-20260103_000000-abc": "abc", "offline-run-20260102_000000-abc-1": "abc",
             "offline-run-20260102_000000-abc-2": "abc", "offline-run-20260101_000000-other": "other",
             "offline-run-20260101_000000-abcd": "abcd", "offline-run-20260101_000000-x-abc": "x-abc"}
    for name, run_id in names.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"run-{run_id}.wandb").write_bytes(frame([]))
    (tmp_path / "offline-run-20260104_000000-abc").mkdir()  # no .wandb file: not a segment
    assert [p.parent.name for p in wf.segments(tmp_path, "abc")] == [
        "offline-run-20260101_235959-abc", "offline-run-20260102_000000-abc", "offline-run-20260102_000000-abc-1",
        "offline-run-20260102_000000-abc-2", "run-20260103_000000-abc"]
    assert wf.segments(tmp_path / "missing", "abc") == []
