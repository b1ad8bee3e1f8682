"""Nothing is lost: a save killed at any moment never leaves a checkpoint that passes for valid,
and damaged checkpoints are skipped on resume (and kept aside), never loaded, never deleted."""

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from resilient_slurm.checkpoint import store
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import Snapshot, held
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import (
    SHORT,
    SHORT_STEPS,
    assert_bit_identical,
    events,
    final_tensors,
    finish,
    interrupt,
    launch,
    run_dir,
)
from tests.single_rank import one_rank

pytestmark = pytest.mark.slow


def _save_forever(root: str) -> None:
    comm = one_rank()
    g = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(512, 1024, generator=g) for i in range(8)}  # 16 MB
    optim = {f"layer{i}.weight.exp_avg": torch.randn(512, 1024, generator=g) for i in range(8)}
    step = max([s for s, _ in store.list_step_dirs(Path(root))], default=0)
    while True:
        step += 1
        snap = Snapshot({k: held(v, k) for k, v in model.items()}, {k: held(v, k) for k, v in optim.items()},
                        rng={"step": step}, json_files={"train_state.json": {"step": step}})
        save(Path(root), step, snap, comm, max_shard_bytes=8 << 20, io_threads=2)


def test_sigkill_at_random_moments_during_saves_never_leaves_a_valid_looking_torn_checkpoint(tmp_path):
    root = tmp_path / "ckpts"
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(1234)
    kills = 0
    deadline = time.monotonic() + 240
    # 25 kills, and more while fewer than 5 saves committed (a loaded machine saves slower).
    while kills < 25 or len(store.list_step_dirs(root)) < 5:
        assert time.monotonic() < deadline, "the saver never got far enough to test anything"
        proc = ctx.Process(target=_save_forever, args=(str(root),))
        proc.start()
        time.sleep(rng.uniform(0.05, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        kills += 1
        for step, path in store.list_step_dirs(root):
            verdict = verify(path)
            assert verdict.ok, f"after kill {kills}: {path.name} is visible but invalid: {verdict.reason}"
            assert verdict.manifest.step == step
    store.remove_partial_saves(root)
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp.")]


def test_corrupt_and_torn_checkpoints_are_skipped_recorded_and_kept(tmp_path, short_straight):
    # Keep optimizer state on the newest 3, so the third-newest still resumes exactly.
    keep = [*SHORT, "checkpoint.optimizer_on_last=3"]

    rdir = run_dir(tmp_path, "damaged")
    code, out = interrupt(launch(tmp_path, "damaged", *keep), rdir, 35, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    newest, torn, good = [p for _, p in store.list_step_dirs(rdir / "checkpoints")][:3]
    optimizer_file = newest / "optimizer.safetensors"
    data = bytearray(optimizer_file.read_bytes())
    data[len(data) // 2] ^= 0x10  # one flipped bit in the middle of the optimizer state
    optimizer_file.write_bytes(bytes(data))
    (torn / "manifest.json").unlink()  # as if the save died before its marker

    code, out = finish(launch(tmp_path, "damaged", *keep))
    assert code == ExitCode.DONE, out
    ev = events(rdir)
    skipped = [(Path(e.details.path).name, e.details.reason) for e in ev if e.kind is Kind.CHECKPOINT_SKIPPED]
    assert skipped == [(newest.name, "checksum mismatch in optimizer.safetensors"),
                       (torn.name, "no manifest.json commit marker: the save did not finish")]
    (resumed,) = [e for e in ev if e.kind is Kind.RESUME]
    assert resumed.details.checkpoint == str(good)
    quarantined = sorted(p.name.split(".")[0] for p in (rdir / "checkpoints" / ".quarantine").iterdir())
    assert quarantined == sorted([newest.name, torn.name])
    assert_bit_identical(final_tensors(short_straight(1), SHORT_STEPS), final_tensors(rdir, SHORT_STEPS))
