"""The manifest: sizes and CRC32 of every file in a checkpoint. Pure.

It is also the commit marker: written last, atomically, after every rank's files are durable.
A directory without it is a torn save; a file that differs from it is corruption.

Since version 2 a file larger than one chunk (`CHUNK_BYTES`) also lists the CRC32 of each chunk,
so a rank that needs only some byte ranges of a file (a resume at another world size reads only its
rows) checks what it read without reading the rest.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from resilient_slurm.checkpoint.layout import FORMAT_NAME, FORMAT_VERSION, READABLE_VERSIONS

CHUNK_BYTES = 1 << 20
"""Bytes covered by one chunk CRC; a partial read rounds its ranges out to chunks."""


class ManifestError(ValueError):
    """The manifest is missing, malformed or from an unknown format version."""


@dataclass(frozen=True)
class FileEntry:
    nbytes: int
    crc32: int
    chunks: tuple[int, ...] = ()
    """CRC32 of each CHUNK_BYTES of the file, in order (empty for a file of one chunk, and in
    version 1 manifests)."""


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    created: str

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "step": self.step,
            "world_size": self.world_size,
            "created": self.created,
            "chunk_bytes": CHUNK_BYTES,
            "files": {p: _entry(e) for p, e in sorted(self.files.items())},
        }
        return json.dumps(body, indent=1).encode()

    @staticmethod
    def from_json(raw: bytes) -> Manifest:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ManifestError("manifest.json is not valid JSON") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT_NAME:
            raise ManifestError("manifest.json is not a resilient_slurm checkpoint manifest")
        if body.get("version") not in READABLE_VERSIONS:
            raise ManifestError(
                f"unknown format version {body.get('version')!r} (this build reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))})"
            )
        if body.get("chunk_bytes", CHUNK_BYTES) != CHUNK_BYTES:
            raise ManifestError(f"chunk_bytes {body.get('chunk_bytes')!r} is not {CHUNK_BYTES}")
        try:
            files = {}
            for path, entry in body["files"].items():
                if not is_safe_relative(path):
                    raise ManifestError(f"manifest entry {path!r} names a path outside the directory")
                chunks = tuple(int(c, 16) for c in entry.get("chunks", ()))
                files[path] = FileEntry(int(entry["bytes"]), int(entry["crc32"], 16), chunks)
            return Manifest(int(body["step"]), int(body["world_size"]), files, str(body["created"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, ManifestError):
                raise
            raise ManifestError(f"manifest.json is missing or has a bad field ({e.__class__.__name__}: {e})") from None


def is_safe_relative(path: str) -> bool:
    """True for a plain relative path that stays inside the checkpoint directory."""
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        return False
    if posixpath.isabs(path):
        return False
    norm = posixpath.normpath(path)
    return norm == path and not norm.startswith("..") and norm != "."


def _entry(e: FileEntry) -> dict:
    out: dict = {"bytes": e.nbytes, "crc32": f"{e.crc32:08x}"}
    if len(e.chunks) > 1:
        out["chunks"] = [f"{c:08x}" for c in e.chunks]
    return out
