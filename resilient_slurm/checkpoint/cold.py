"""The cold tier: committed checkpoints copied to a shared filesystem or an object store.

Any fsspec URL works (`/shared/ckpt`, `s3://bucket/prefix`, ...); fsspec and the store's driver
(s3fs for S3) are imported only when a cold tier is configured. The layout mirrors the hot tier,
`<url>/step_00000100/<files>`, and `manifest.json` is again the commit marker, written last. Object
stores cannot rename a directory, so nothing is renamed: a step whose marker is missing is an
unfinished copy, never read, and replaced by the next copy of that step. Markers themselves are
written beside and then moved into place, so a reader never sees half a manifest.

An upload is verified before its marker is written: every file is read back from the store and its
size and CRC32 compared with the manifest. A download checks the same on the way into the hot tier.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.crc32 import crc32
from resilient_slurm.checkpoint.manifest import Manifest, ManifestError
from resilient_slurm.checkpoint.safetensors_io import file_crc32, write_bytes

_READ_BLOCK = 8 << 20
PARTS_DIR = ".parts"
"""Per-node completion marks of a checkpoint uploaded by several nodes."""


class ColdTierError(RuntimeError):
    """A copy to or from the cold tier failed; the message names the file and why."""


class Cancelled(ColdTierError):
    """The copy was stopped before its marker was written (the process is exiting)."""


class ColdTier:
    def __init__(self, url: str, threads: int) -> None:
        import fsspec  # lazily: only runs with a cold tier import it (and its store's driver)

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self.threads = threads
        self._local = "file" in _protocols(self.fs)

    def describe(self, step: int) -> str:
        return f"{self.url}/{layout.step_dir_name(step)}"

    def steps(self) -> list[int]:
        """Committed steps (their marker exists), newest first."""
        self.fs.invalidate_cache(self.root)  # another process (an earlier attempt) may have written
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=False):
            step = layout.parse_step_dir(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None and self.fs.exists(self._path(step, layout.MANIFEST)):
                found.append(step)
        return sorted(found, reverse=True)

    def manifest(self, step: int) -> Manifest:
        return Manifest.from_json(self.fs.cat_file(self._path(step, layout.MANIFEST)))

    def upload(self, src: Path, manifest: Manifest, cancelled: Callable[[], bool]) -> None:
        """Copy a committed hot checkpoint, read every file back to check it, then write the marker."""
        step = manifest.step
        if self.fs.exists(self._path(step)):
            self.fs.rm(self._path(step), recursive=True)  # an unfinished earlier copy, or a stale one

        rels = sorted(manifest.files)
        self._parallel(lambda rel: self._put(src, step, rel, cancelled), rels)
        self._parallel(lambda rel: self._check(step, rel, manifest, cancelled), rels)
        self._write_marker(step, manifest.to_json())

    def _put(self, src: Path, step: int, rel: str, cancelled: Callable[[], bool]) -> None:
        if cancelled():
            raise Cancelled(f"copy of {src.name} stopped before {rel}")
        self.fs.makedirs(self._path(step, rel).rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(str(src / rel), self._path(step, rel))
        if self._local:
            store.fsync_path(self._path(step, rel))

    def _check(self, step: int, rel: str, manifest: Manifest, cancelled: Callable[[], bool]) -> None:
        if cancelled():
            raise Cancelled(f"copy of step {step} stopped while checking {rel}")
        nbytes, crc = self._remote_digest(self._path(step, rel))
        entry = manifest.files[rel]
        if (nbytes, crc) != (entry.nbytes, entry.crc32):
            raise ColdTierError(f"{self.describe(step)}/{rel} reads back as {nbytes} bytes, CRC {crc:08x}; "
                                f"expected {entry.nbytes} bytes, CRC {entry.crc32:08x}")

    def upload_part(self, src: Path, manifest: Manifest, rels: list[str], part: str, parts: int,
                    cancelled: Callable[[], bool]) -> None:
        """One node's files of a checkpoint spread over `parts` nodes (a node-local hot tier):
        copied and read back like `upload`, then marked done (`.parts/<part>`); the node that
        finds every part done writes the marker. Each node marks its part before it looks at the
        others, so the last one to finish always sees them all."""
        step = manifest.step
        self._parallel(lambda rel: self._put(src, step, rel, cancelled), sorted(rels))
        self._parallel(lambda rel: self._check(step, rel, manifest, cancelled), sorted(rels))
        self.fs.pipe_file(self._path(step, f"{PARTS_DIR}/{part}"), b"")
        self.fs.invalidate_cache(self._path(step, PARTS_DIR))
        if len(self.fs.ls(self._path(step, PARTS_DIR), detail=False)) >= parts:
            self._write_marker(step, manifest.to_json())

    def download(self, step: int, dest: Path) -> Manifest:
        """Copy a cold checkpoint into `dest` (a new directory), each file checked against the
        manifest, the marker written last; the caller renames `dest` into place."""
        try:
            manifest = self.manifest(step)
        except (ManifestError, OSError) as e:
            raise ColdTierError(f"{self.describe(step)}: unreadable manifest: {e}") from None
        (dest / layout.RNG_DIR).mkdir(parents=True)

        def get(rel: str) -> None:
            local = dest / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(self._path(step, rel), str(local))
            store.fsync_path(str(local))
            entry = manifest.files[rel]
            if local.stat().st_size != entry.nbytes or file_crc32(str(local)) != entry.crc32:
                raise ColdTierError(f"{self.describe(step)}/{rel}: size or checksum differs from the manifest")

        self._parallel(get, sorted(manifest.files))
        store.fsync_path(dest / layout.RNG_DIR)
        write_bytes(str(dest / layout.MANIFEST), manifest.to_json())
        store.fsync_path(dest)
        return manifest

    def delete(self, step: int) -> None:
        # The marker first: a crash mid-delete leaves an unfinished copy, never a checkpoint that
        # looks valid with files missing.
        if self.fs.exists(self._path(step, layout.MANIFEST)):
            self.fs.rm(self._path(step, layout.MANIFEST))
        self.fs.rm(self._path(step), recursive=True)

    def strip_optimizer(self, step: int) -> None:
        """Drop optimizer state: the new marker first (atomically), then the files."""
        manifest = self.manifest(step)
        dropped = [f for f in manifest.files if layout.is_optimizer_file(f)]
        if not dropped:
            return
        kept = Manifest(manifest.step, manifest.world_size,
                        {f: e for f, e in manifest.files.items() if f not in dropped}, manifest.created)
        self._write_marker(step, kept.to_json())
        self.fs.rm([self._path(step, f) for f in dropped])

    def _write_marker(self, step: int, data: bytes) -> None:
        tmp = self._path(step, f".{layout.MANIFEST}.tmp")
        self.fs.pipe_file(tmp, data)
        if self._local:
            store.fsync_path(tmp)
        self.fs.mv(tmp, self._path(step, layout.MANIFEST))
        if self._local:
            store.fsync_path(Path(self._path(step)))

    def _remote_digest(self, path: str) -> tuple[int, int]:
        nbytes, crc = 0, 0
        with self.fs.open(path, "rb", block_size=_READ_BLOCK) as f:
            while block := f.read(_READ_BLOCK):
                nbytes += len(block)
                crc = crc32(block, crc)
        return nbytes, crc

    def _path(self, step: int, rel: str | None = None) -> str:
        base = f"{self.root}/{layout.step_dir_name(step)}"
        return f"{base}/{rel}" if rel else base

    def _parallel(self, fn: Callable[[str], None], items: list[str]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(items)))) as pool:
            list(pool.map(fn, items))


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
