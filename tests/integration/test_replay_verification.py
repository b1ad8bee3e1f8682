"""Replay verification in real runs (one rank, real processes, SIGKILL): after a restart, the steps
recomputed since the checkpoint must reproduce the losses logged before the failure.

Memory saves every 5 steps, disk saves every 25; a hang injected at step 34 holds the first attempt
after step 33 (logged) and the memory save of step 30 (committed), where it is killed. The relaunch
(no fault) resumes from the memory tier at 30 and recomputes 31-33.

What is faked in the corrupted case: the damage itself. A bit of the memory tier's copy of
`model.norm.weight` is flipped on disk and the file's CRCs in the manifest are recomputed, as if the
bytes had been corrupted before their CRCs were taken (in host memory, before the copy). Nothing
else is: the resume verifies the CRCs, loads, trains, and replay verification finds the difference."""

import json
import os
import shutil
import signal
import struct
import time
import uuid
import zlib
from pathlib import Path

import pytest

from resilient_slurm.checkpoint.manifest import CHUNK_BYTES, FileEntry, Manifest
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import MemorySave, ReplayChecked, ReplayMismatch, Resume, Save, select
from resilient_slurm.rundir.metrics import read_metrics
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, launch, last_step, run_dir

pytestmark = pytest.mark.slow

STEPS = 40
COMMON = [f"train.max_steps={STEPS}", "checkpoint.memory.every_steps=5"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    root = tmp_path_factory.mktemp("twin")
    code, out = finish(launch(root, "straight", f"train.max_steps={STEPS}"))
    assert code == ExitCode.DONE, out
    return final_tensors(run_dir(root, "straight"), STEPS)


@pytest.fixture
def shm():
    path = Path("/dev/shm") / f"rs-replay-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def killed_after_step_33(root: Path, name: str, shm: Path) -> Path:
    """The first attempt, killed while it hangs at step 34: metrics to 33, memory tier at 30, disk at 25."""
    rdir = run_dir(root, name)
    proc = launch(root, name, *COMMON, f"checkpoint.memory.dir={shm}", "fault.hang_at_step=34")
    deadline = time.monotonic() + 180
    while not (last_step(rdir) >= 33 and any(e.step == 30 and e.details.ok for e in select(events(rdir), MemorySave))):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the first attempt did not reach step 33"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert max(e.step for e in select(events(rdir), Save)) == 25 and last_step(rdir) == 33
    return rdir


def lost_losses(rdir: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_metrics(rdir / "metrics-lost.jsonl")}


def test_a_clean_restart_reproduces_every_recomputed_step(tmp_path, shm, twin):
    rdir = killed_after_step_33(tmp_path, "clean", shm)
    code, out = finish(launch(tmp_path, "clean", *COMMON, f"checkpoint.memory.dir={shm}"))
    assert code == ExitCode.DONE, out
    ev = events(rdir)
    assert [(e.details.source, e.step) for e in select(ev, Resume)] == [("memory", 30)]
    assert not select(ev, ReplayMismatch)
    (checked,) = select(ev, ReplayChecked)
    assert (checked.details.compared, checked.details.first, checked.step) == (3, 31, 33)
    assert (checked.details.source, checked.details.fallbacks, checked.details.not_compared) == ("memory", 0, None)
    rows = {row["step"]: row["loss"] for row in read_metrics(rdir / "metrics.jsonl")}
    assert all(rows[s] == v for s, v in lost_losses(rdir).items())  # what the replay compared
    assert_bit_identical(twin, final_tensors(rdir, STEPS))


def flip_a_bit_behind_the_crcs(step_dir: Path, tensor: str) -> None:
    """Flip the top mantissa bit of the tensor's first float32 (1.0 becomes 1.5), then rewrite the
    file's whole and per-chunk CRCs in the manifest so the copy still verifies."""
    path = step_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    assert header[tensor]["dtype"] == "F32"
    offset = 8 + size + header[tensor]["data_offsets"][0]
    data[offset + 2] ^= 0x40  # little-endian float32: byte 2 holds mantissa bits 16-22
    path.write_bytes(bytes(data))
    manifest = Manifest.from_json((step_dir / "manifest.json").read_bytes())
    old = manifest.files["model.safetensors"]
    chunks = tuple(zlib.crc32(data[i:i + CHUNK_BYTES]) for i in range(0, len(data), CHUNK_BYTES)) if old.chunks else ()
    manifest.files["model.safetensors"] = FileEntry(len(data), zlib.crc32(data), chunks)
    (step_dir / "manifest.json").write_bytes(manifest.to_json())


def test_a_restored_state_corrupted_behind_its_crcs_is_caught_and_the_run_falls_back_to_the_disk(tmp_path, shm,
                                                                                                twin):
    rdir = killed_after_step_33(tmp_path, "corrupt", shm)
    before = lost_losses(rdir) or {row["step"]: row["loss"] for row in read_metrics(rdir / "metrics.jsonl")}
    copy = shm / "tiny_sft" / "corrupt" / "step_00000030"
    flip_a_bit_behind_the_crcs(copy, "model.norm.weight")

    code, out = finish(launch(tmp_path, "corrupt", *COMMON, f"checkpoint.memory.dir={shm}"))
    assert code == ExitCode.DONE, out
    ev = events(rdir)
    assert [(e.details.source, e.step) for e in select(ev, Resume)] == [("memory", 30)]  # the CRCs passed
    (mismatch,) = select(ev, ReplayMismatch)
    d = mismatch.details
    assert (mismatch.step, d.source, d.action, d.checkpoint) == (31, "memory", "fallback", str(copy))
    assert d.expected == before[31] != d.got and d.nodes == [os.uname().nodename]
    assert not copy.exists()  # set aside: the next load took the disk's step 25
    (checked,) = select(ev, ReplayChecked)
    assert (checked.details.source, checked.details.fallbacks, checked.details.first, checked.step) == \
        ("hot", 1, 26, 33)
    assert checked.details.compared == 8 and checked.details.checkpoint.endswith("step_00000025")
    steps = [row["step"] for row in read_metrics(rdir / "metrics.jsonl")]
    assert steps == list(range(1, STEPS + 1))  # the differing step never reached the metrics
    assert_bit_identical(twin, final_tensors(rdir, STEPS))
