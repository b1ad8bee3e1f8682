"""Disk full during a save: the hot tier is a small tmpfs that holds two checkpoints, not three. The
save fails cleanly (nothing half-written becomes visible), the previous checkpoints stay and verify,
the failure is recorded, and the run goes on or stops as `checkpoint.on_failure` says."""

import os
import subprocess
from pathlib import Path

import pytest

from resilient_slurm.checkpoint import store
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import SHORT, events, finish, launch, run_dir

pytestmark = pytest.mark.slow

CHECKPOINT_BYTES = 1_880_000  # runs.SMALL (tiny chat vocabulary) with AdamW state, rounded up from its save events


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "hot"
    mnt.mkdir()
    size_kib = int(2.5 * CHECKPOINT_BYTES) // 1024
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def hot_checkpoints(mnt: Path) -> Path:
    return mnt / "tiny_sft" / "full"


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_disk_full_fails_the_save_cleanly_and_training_follows_the_policy(tmp_path, small_tmpfs, policy):
    rdir = run_dir(tmp_path, "full")
    code, out = finish(launch(tmp_path, "full", *SHORT, f"checkpoint.hot_dir={small_tmpfs}",
                              f"checkpoint.on_failure={policy}", "checkpoint.keep_last=2",
                              "checkpoint.optimizer_on_last=0"))
    ev = events(rdir)
    saved = [e.step for e in ev if e.kind is Kind.SAVE]
    failed = [e for e in ev if e.kind is Kind.SAVE_FAILED]
    assert saved == [10, 20], out
    assert failed and failed[0].step == 30
    assert all("No space left on device" in e.details.error for e in failed), failed[0].details.error

    # The checkpoints before the failure stay, intact; nothing of the failed saves is left.
    root = hot_checkpoints(small_tmpfs)
    assert [s for s, _ in store.list_step_dirs(root)] == [20, 10]
    assert all(verify(p).ok for _, p in store.list_step_dirs(root))
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp.")]

    if policy == "continue":
        assert code == ExitCode.DONE, out
        assert [e.step for e in failed] == [30, 40, 50, 60]  # every later save, final included
        assert ev[-1].kind is Kind.FINISH
    else:
        # The async save at 30 fails in the background; the next save point (40) ends the run.
        assert code == ExitCode.FAILED, out
        (crash,) = [e for e in ev if e.kind is Kind.CRASH]
        assert crash.step == 40 and "on_failure=stop" in crash.details.error
        assert [e.step for e in failed] == [30]
