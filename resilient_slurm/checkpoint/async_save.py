"""Async saves: the caller blocks while the ranks agree on the plan and the state is staged; the
rest runs on a thread of its own.

The thread writes the staged files, fsyncs them, and runs the commit protocol of `save.py` (the
checks and the marker included) with collectives on the checkpoint's own process group. At most
one save is in flight: the staging buffers are reused, so a new save must wait until the last
one has been written. The thread is not a daemon, so the interpreter does not exit under it;
callers `wait()` before they exit anyway, so the outcome is recorded.

A failure is reported to `done` (and the temporary directory removed by the protocol): nothing
half-written ever becomes visible, and the previous checkpoints are untouched.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from resilient_slurm.checkpoint.nodes import Spread
from resilient_slurm.checkpoint.collectives import Collectives
from resilient_slurm.checkpoint.save import (
    SaveError,
    SaveResult,
    prepare,
    tmp_path,
    write_and_commit,
)
from resilient_slurm.checkpoint.staging import Stager
from resilient_slurm.checkpoint.state import Snapshot

BACKGROUND_NICE = 10

Done = Callable[[SaveResult | None, str | None, float], None]
"""Called on the save's thread with (result, None, blocking seconds) or (None, reason, ...)."""


class AsyncSaver:
    def __init__(self, root: Path, group: Collectives, max_shard_bytes: int, io_threads: int,
                 spread: Spread | None = None) -> None:
        self.root = root
        self.group = group
        self.spread = spread
        self.max_shard_bytes = max_shard_bytes
        self.io_threads = io_threads
        self.stager = Stager()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        """perf_counter() when the save in flight began."""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def save(self, step: int, snap: Snapshot, done: Done) -> float:
        """Stage `snap` and start writing it; returns the seconds the caller was blocked.

        Every rank must call this for the same step (the commit is collective)."""
        if self.busy:
            raise RuntimeError("a save is already in flight; wait() for it first")
        start = time.perf_counter()
        try:
            # On the checkpoint's group from this thread: no save is in flight to use it.
            files = prepare(self.root, step, snap, self.group, self.max_shard_bytes, self.spread)
        except SaveError as e:
            blocking = time.perf_counter() - start
            done(None, str(e), blocking)
            return blocking
        staged = self.stager.stage(files.tensors)
        blocking = time.perf_counter() - start
        tmp = tmp_path(self.root, step)
        outs = [s.out_file(str(tmp / s.rel)) for s in staged]

        def run() -> None:
            # Training comes first: this thread and the I/O threads it starts (which inherit it)
            # get CPU time the training threads leave. Linux scopes nice to the thread.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
            try:
                result = write_and_commit(self.root, step, files.plan, outs, files.blobs, self.group, self.io_threads,
                                          spread=self.spread, problem=files.problem)
            except Exception as e:  # noqa: BLE001 - reported to the caller's ledger, never lost
                done(None, str(e) if isinstance(e, SaveError) else f"{e.__class__.__name__}: {e}", blocking)
                return
            done(result, None, blocking)

        self.started_at = start
        self._thread = threading.Thread(target=run, name=f"checkpoint-save-{step}")
        self._thread.start()
        return blocking

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
