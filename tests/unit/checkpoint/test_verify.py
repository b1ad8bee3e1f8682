import json
import subprocess
import sys

import pytest

from resilient_slurm.checkpoint.verify import verify


def _flip_byte(path, offset_from_end=10):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def _set_manifest(ckpt, change):
    m = json.loads((ckpt / "manifest.json").read_text())
    change(m)
    (ckpt / "manifest.json").write_text(json.dumps(m))


def test_a_fresh_checkpoint_verifies(make_checkpoint):
    verdict = verify(make_checkpoint())
    assert verdict.ok, verdict.reason
    assert verdict.manifest.step == 1


def test_sharded_checkpoint_verifies(make_checkpoint):
    ckpt = make_checkpoint(max_shard_bytes=1 << 20)
    names = sorted(p.name for p in ckpt.iterdir())
    assert "model.safetensors" in names  # the tiny model fits one file
    ckpt2 = make_checkpoint(step=2, max_shard_bytes=1)  # every tensor its own shard
    names2 = sorted(p.name for p in ckpt2.iterdir())
    assert "model.shards.json" in names2 and "model-00001-of-00003.safetensors" in names2
    assert verify(ckpt2).ok


CASES = {
    "no marker": (lambda c: (c / "manifest.json").unlink(), "no manifest.json commit marker"),
    "truncated": (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:-100]),
                  "truncated file model.safetensors"),
    "grown": (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes() + b"\0" * 17),
              "file model.safetensors is 17 bytes longer than the manifest says"),
    "bit flip": (lambda c: _flip_byte(c / "optimizer.safetensors"), "checksum mismatch in optimizer.safetensors"),
    "json bit flip": (lambda c: _flip_byte(c / "train_state.json", 3), "checksum mismatch in train_state.json"),
    "bad header": (lambda c: (c / "model.safetensors").write_bytes(
        b"\xff" * 8 + (c / "model.safetensors").read_bytes()[8:]), "bad safetensors header in model.safetensors"),
    "unknown version": (lambda c: _set_manifest(c, lambda m: m.update(version=99)), "unknown format version 99"),
    "missing file": (lambda c: (c / "scheduler.json").unlink(), "missing file scheduler.json"),
    "manifest path escapes": (lambda c: _set_manifest(c, lambda m: m["files"].update({"../x": {"bytes": 1, "crc32": "0"}})),
                              "names a path outside the directory"),
    "not json": (lambda c: (c / "manifest.json").write_text("{"), "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_checkpoints_are_rejected_with_the_reason(make_checkpoint, case):
    damage, reason = CASES[case]
    ckpt = make_checkpoint()
    damage(ckpt)
    verdict = verify(ckpt)
    assert not verdict.ok
    assert reason in verdict.reason


def _rewrite_index(ckpt, edit):
    """Change model.shards.json and keep the manifest consistent, so only the index is wrong."""
    import zlib

    index = ckpt / "model.shards.json"
    body = json.loads(index.read_text())
    edit(body["tensors"])
    index.write_text(json.dumps(body))
    _set_manifest(ckpt, lambda m: m["files"]["model.shards.json"].update(
        bytes=index.stat().st_size, crc32=f"{zlib.crc32(index.read_bytes()):08x}"))


def test_index_entry_outside_the_directory(make_checkpoint):
    ckpt = make_checkpoint(max_shard_bytes=1)
    _rewrite_index(ckpt, lambda t: t["lm_head.weight"]["chunks"][0].__setitem__(0, "../../etc/passwd"))
    verdict = verify(ckpt)
    assert not verdict.ok and "names a path outside the directory" in verdict.reason


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t["lm_head.weight"]["chunks"].append(t["lm_head.weight"]["chunks"][0]),
     "the chunks of lm_head.weight do not tile it: chunks [0:64, 0:16] and [0:64, 0:16] overlap"),
    (lambda t: t["lm_head.weight"]["shape"].__setitem__(0, 65),
     "the chunks of lm_head.weight do not tile it: no chunk holds [64:65, 0:16]"),
    (lambda t: t["lm_head.weight"]["shape"].__setitem__(0, 63), "chunk [0:64, 0:16] lies outside the tensor's shape"),
    (lambda t: t["lm_head.weight"].update(dtype="BF16"), "does not hold [0:64, 0:16] of lm_head.weight"),
])
def test_a_shards_index_that_does_not_match_the_files_is_rejected(make_checkpoint, edit, reason):
    ckpt = make_checkpoint(max_shard_bytes=1)
    _rewrite_index(ckpt, edit)
    verdict = verify(ckpt)
    assert not verdict.ok and reason in verdict.reason, verdict.reason


def test_cli_exit_codes_and_one_line(make_checkpoint, tmp_path):
    good = make_checkpoint()
    bad = make_checkpoint(step=2)
    _flip_byte(bad / "model.safetensors")
    run = lambda *paths: subprocess.run([sys.executable, "-m", "resilient_slurm.checkpoint", "verify", *map(str, paths)],
                                        capture_output=True, text=True)
    ok = run(good)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: ") and ok.stdout.count("\n") == 1
    fail = run(bad)
    assert fail.returncode == 1
    assert fail.stdout.strip() == f"invalid: {bad}: checksum mismatch in model.safetensors"
    assert run().returncode == 2


def test_a_run_directory_is_named_as_one_and_its_checkpoints_listed(make_checkpoint, tmp_path):
    from resilient_slurm.config import Config
    from resilient_slurm.rundir.identity import write_config

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    write_config(run_dir, Config())
    run = lambda path: subprocess.run([sys.executable, "-m", "resilient_slurm.checkpoint", "verify", str(path)],
                                      capture_output=True, text=True)
    empty = run(run_dir)
    assert empty.returncode == 2
    assert empty.stdout == f"not a checkpoint: {run_dir}: a run directory; verify one of its checkpoints: it has none yet\n"
    for step in (50, 100):
        make_checkpoint(step=step, root=run_dir / "checkpoints")
    listed = run(run_dir)
    assert listed.returncode == 2 and listed.stdout.splitlines() == [
        f"not a checkpoint: {run_dir}: a run directory; verify one of its checkpoints (newest first):",
        f"  {run_dir}/checkpoints/step_00000100", f"  {run_dir}/checkpoints/step_00000050"]
