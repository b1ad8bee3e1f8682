"""Is a checkpoint directory complete and intact? Cheap checks first, checksums last."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.chunks import tiling_gap
from resilient_slurm.checkpoint.manifest import (
    Manifest,
    ManifestError,
    is_safe_relative,
)
from resilient_slurm.checkpoint.safetensors_io import (
    DTYPES,
    FormatError,
    Header,
    file_crc32,
    read_header,
)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    manifest: Manifest | None = None


def verify(path: Path, checksums: bool = True) -> Verdict:
    """Check marker, manifest, sizes, safetensors headers and index entries, then (optionally) CRCs.

    Resume passes `checksums=False` and checks CRCs while it reads (one pass over the data).
    """
    if not path.is_dir():
        return Verdict(False, f"{path} is not a directory")
    marker = path / layout.MANIFEST
    if not marker.is_file():
        return Verdict(False, f"no {layout.MANIFEST} commit marker: the save did not finish")
    try:
        manifest = Manifest.from_json(marker.read_bytes())
    except ManifestError as e:
        return Verdict(False, str(e))
    problem = check_files(path, manifest, checksums)
    if problem:
        return Verdict(False, problem)
    return Verdict(True, "ok", manifest)


def check_files(path: Path, manifest: Manifest, checksums: bool) -> str | None:
    """What is wrong with the files of `path` against `manifest`, or None. Also run by a save on
    its temporary directory just before it writes the marker."""
    for rel, entry in manifest.files.items():
        f = path / rel
        if not f.is_file():
            return f"missing file {rel}"
        size = f.stat().st_size
        if size < entry.nbytes:
            return f"truncated file {rel}: {size} of {entry.nbytes} bytes"
        if size > entry.nbytes:
            return f"file {rel} is {size - entry.nbytes} bytes longer than the manifest says ({size} instead of " \
                   f"{entry.nbytes}): written to after the commit"
    structure = _check_structure(path, manifest)
    if structure:
        return structure
    if checksums:
        for rel, entry in manifest.files.items():
            if file_crc32(str(path / rel)) != entry.crc32:
                return f"checksum mismatch in {rel}"
    return None


def _check_structure(path: Path, manifest: Manifest) -> str | None:
    files = manifest.files
    if layout.TRAIN_STATE not in files:
        return f"no {layout.TRAIN_STATE} in the manifest"
    headers: dict[str, Header] = {}
    docs: dict[str, object] = {}
    for rel in files:
        if rel.endswith(".safetensors"):
            try:
                headers[rel] = read_header(str(path / rel))
            except FormatError as e:
                return f"bad safetensors header in {rel}: {e}"
        elif rel.endswith(".json"):
            try:
                docs[rel] = json.loads((path / rel).read_bytes())
            except (UnicodeDecodeError, json.JSONDecodeError):
                return f"{rel} is not valid JSON"
    for prefix, required in ((layout.MODEL, True), (layout.OPTIMIZER, False)):
        if layout.shards_file(prefix) in files:
            problem = _check_pieces(layout.shards_file(prefix), docs[layout.shards_file(prefix)], headers)
        else:
            problem = _check_weights(path, files, prefix, required)
        if problem:
            return problem
    return None


def _check_pieces(index_name: str, index: object, headers: dict[str, Header]) -> str | None:
    """Every tensor of a shards index is tiled by its chunks, each element exactly once, and each
    chunk is in its file with the shape and dtype the index says."""
    try:
        tensors = index["tensors"]  # type: ignore[index]
        for name, t in tensors.items():
            shape, dtype = tuple(int(d) for d in t["shape"]), DTYPES[t["dtype"]]
            boxes = []
            for rel, box in layout.index_chunks(t):
                if not is_safe_relative(rel):
                    return f"{index_name} entry {rel!r} names a path outside the directory"
                if rel not in headers:
                    return f"{index_name} names {rel}, which is not in the manifest"
                info = headers[rel].tensors.get(name)
                if info is None or info.dtype != dtype or info.shape != box.lengths:
                    return f"{rel} does not hold {box.describe()} of {name} as {index_name} says"
                boxes.append(box)
            gap = tiling_gap(shape, boxes)
            if gap:
                return f"{index_name}: the chunks of {name} do not tile it: {gap}"
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return f"{index_name} is malformed ({e.__class__.__name__}: {e})"
    return None


def _check_weights(path: Path, files: dict, prefix: str, required: bool) -> str | None:
    """Version 1: `<prefix>.safetensors`, or an HF-style index naming its files."""
    single, index = f"{prefix}.safetensors", layout.index_file(prefix)
    if single in files:
        return None
    if index not in files:
        return f"no {single} or {layout.shards_file(prefix)}" if required else None
    try:
        weight_map = json.loads((path / index).read_bytes())["weight_map"]
        targets = set(weight_map.values())
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return f"{index} has no valid weight_map"
    for target in sorted(targets, key=str):
        if not is_safe_relative(target):
            return f"{index} entry {target!r} names a path outside the directory"
        if target not in files:
            return f"{index} names {target}, which is not in the manifest"
    return None
