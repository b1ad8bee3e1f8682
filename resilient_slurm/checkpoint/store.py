"""Filesystem operations on a checkpoints root: list, clean up, quarantine, prune.

Nothing here deletes a committed checkpoint except `delete`, which retention calls for
checkpoints it has decided are old; corrupt ones are moved aside, never deleted.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from resilient_slurm.files import atomic_write
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.manifest import Manifest


def list_step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Directories named like a checkpoint, newest first (committed or not: verify decides)."""
    if not root.is_dir():
        return []
    found = [(layout.parse_step_dir(p.name), p) for p in root.iterdir() if p.is_dir()]
    return sorted(((s, p) for s, p in found if s is not None), reverse=True)


def pin(root: Path, step: int, holder: str) -> Path:
    """Hold a checkpoint back from retention while another process reads it (a PBT member copying
    it); `unpin` with the returned path. Retention runs in the job that owns the checkpoints, so
    the hold is a file there: `<root>/.pins/<step dir>.<holder>`."""
    pins = root / layout.PINS_DIR
    pins.mkdir(exist_ok=True)
    path = pins / f"{layout.step_dir_name(step)}.{holder}"
    path.touch()
    fsync_path(pins)
    return path


def unpin(path: Path) -> None:
    path.unlink(missing_ok=True)


def pinned_steps(root: Path) -> frozenset[int]:
    """Steps some process holds a pin on."""
    pins = root / layout.PINS_DIR
    if not pins.is_dir():
        return frozenset()
    steps = (layout.parse_step_dir(p.name.partition(".")[0]) for p in pins.iterdir())
    return frozenset(s for s in steps if s is not None)


def remove_partial_saves(root: Path) -> list[Path]:
    """Remove `.tmp.*` directories left by saves that died; they were never visible as checkpoints."""
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(layout.TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def quarantine(path: Path) -> Path:
    """Move a checkpoint directory that failed verification out of the way, keeping it for forensics."""
    dest_root = path.parent / layout.QUARANTINE_DIR
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
    os.rename(path, dest)
    fsync_path(path.parent)
    return dest


def delete(path: Path) -> None:
    # Drop the marker first: a crash mid-delete then leaves a torn directory, never a
    # checkpoint that looks valid with files missing.
    marker = path / layout.MANIFEST
    if marker.exists():
        marker.unlink()
        fsync_path(path)
    shutil.rmtree(path)


def has_optimizer(path: Path) -> bool:
    manifest = Manifest.from_json((path / layout.MANIFEST).read_bytes())
    return any(layout.is_optimizer_file(f) for f in manifest.files)


def strip_optimizer(path: Path) -> None:
    """Drop optimizer state from a committed checkpoint: new manifest first (atomic), then files."""
    manifest = Manifest.from_json((path / layout.MANIFEST).read_bytes())
    dropped = [f for f in manifest.files if layout.is_optimizer_file(f)]
    if not dropped:
        return
    kept = Manifest(manifest.step, manifest.world_size,
                    {f: e for f, e in manifest.files.items() if f not in dropped}, manifest.created)
    atomic_write(path / layout.MANIFEST, kept.to_json())
    for f in dropped:
        (path / f).unlink(missing_ok=True)


def fsync_path(path: str | Path) -> None:
    """fsync a file, or a directory (its entries: a rename in it is durable afterwards)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
