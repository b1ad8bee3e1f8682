"""Copies committed checkpoints from the hot tier to the cold one, in the background (rank 0; on a
node-local hot tier, each node's leader copies its node's files).

Newest first: a copy requested while another is running replaces any copy still waiting, so a
slow store falls behind by skipping checkpoints, never by queueing them. The checkpoints being
copied or waiting are `pinned`: hot-tier retention leaves them alone until the copy is done.
After each copy, the cold tier's own retention runs. Every outcome goes to the ledger.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from resilient_slurm import ledger
from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.cold import Cancelled, ColdTier
from resilient_slurm.checkpoint.manifest import Manifest
from resilient_slurm.checkpoint.retention import CheckpointInfo, Rules, plan_retention
from resilient_slurm.ledger import EventLog


class Uploader:
    def __init__(self, cold: ColdTier, rules: Rules, events: EventLog, part: str | None = None, parts: int = 1,
                 retention: bool = True) -> None:
        """`part`: this uploader copies one node's files of each checkpoint, one of `parts` nodes
        (a node-local hot tier), and the last node to finish writes the marker; `retention`: this
        one also applies the cold tier's retention (one uploader of the run does)."""
        self.cold = cold
        self.rules = rules
        self.events = events
        self.part = part
        self.parts = parts
        self.retention = retention
        self._cv = threading.Condition()
        self._pending: tuple[int, Path, list[str] | None] | None = None
        self._current: int | None = None
        self._closing = False
        self._cancel = False
        # A daemon: if the process dies without close(), an unfinished copy has no marker and is
        # never read, so nothing is lost by abandoning it.
        self._thread = threading.Thread(target=self._loop, name="checkpoint-cold-copy", daemon=True)
        self._thread.start()

    def request(self, step: int, path: Path, rels: list[str] | None = None) -> None:
        """Copy checkpoint `path` (only its files `rels`, one node's part, when given)."""
        with self._cv:
            self._pending = (step, path, rels)
            self._cv.notify_all()

    def pinned(self) -> frozenset[int]:
        with self._cv:
            return frozenset(s for s in (self._current, self._pending[0] if self._pending else None) if s is not None)

    def idle(self) -> bool:
        with self._cv:
            return self._current is None and self._pending is None

    def close(self, finish: bool) -> None:
        """Stop the thread: after the copies requested so far (`finish`), or now (a copy under way
        is abandoned before its marker)."""
        with self._cv:
            self._closing = True
            if not finish:
                self._cancel = True
                self._pending = None
            self._cv.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closing:
                    self._cv.wait()
                if self._pending is None:
                    return
                (step, path, rels), self._pending = self._pending, None
                self._current = step
            self._copy(step, path, rels)
            with self._cv:
                self._current = None
                self._cv.notify_all()

    def _copy(self, step: int, path: Path, rels: list[str] | None) -> None:
        start = time.perf_counter()
        try:
            manifest = Manifest.from_json((path / layout.MANIFEST).read_bytes())
            if self.part is None:
                self.cold.upload(path, manifest, cancelled=lambda: self._cancel)
            else:
                self.cold.upload_part(path, manifest, rels or [], self.part, self.parts, cancelled=lambda: self._cancel)
        except Cancelled as e:
            self.events.emit(ledger.ColdCopyCancelled(reason=str(e)), step)
            return
        except Exception as e:  # noqa: BLE001 - a failed copy is recorded; the hot copy stays
            self.events.emit(ledger.ColdCopyFailed(path=self.cold.describe(step), error=f"{e.__class__.__name__}: {e}"),
                             step)
            return
        nbytes = sum(manifest.files[rel].nbytes for rel in (manifest.files if rels is None else rels))
        self.events.emit(ledger.ColdCopy(path=self.cold.describe(step), bytes=nbytes,
                                         seconds=round(time.perf_counter() - start, 4), verified=True), step)
        if self.retention:
            self._retention(step)

    def _retention(self, step: int) -> None:
        try:
            steps = self.cold.steps()
            infos = [CheckpointInfo(s, any(layout.is_optimizer_file(f) for f in self.cold.manifest(s).files))
                     for s in steps]
            plan = plan_retention(infos, self.rules)
            for s in plan.delete:
                self.cold.delete(s)
            for s in plan.strip_optimizer:
                self.cold.strip_optimizer(s)
        except Exception as e:  # noqa: BLE001 - retention failing must not stop copies
            self.events.emit(ledger.ColdRetentionFailed(error=f"{e.__class__.__name__}: {e}"), step)
            return
        if plan.delete or plan.strip_optimizer:
            self.events.emit(ledger.ColdRetention(deleted=list(plan.delete), optimizer_stripped=list(plan.strip_optimizer)),
                             step)
