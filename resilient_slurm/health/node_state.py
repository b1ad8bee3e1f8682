"""A node's local health state: kernel-log cursors and the Xid history, under one directory.

Layout, keyed by the Slurm node name so that several `slurmd -N` nodes on one machine never share
a cursor:

    <state_dir>/<node>/cursor.json                  where the last scan of this node's log ended
    <state_dir>/<node>/runs/<job>.<restart>.json    where the log stood when this run's Prolog ran
    <state_dir>/<node>/history.json                 repeat-counted Xids: [{xid, gpu, job, time_s}]
    <state_dir>/<node>/.lock                        held while a scan updates the files above

A run is a job id plus its restart count: a requeued job keeps its id, and its next Epilog must
not start from the cursor an earlier run's Prolog left behind. A missing or unreadable file reads
as absent, which makes the next scan judge more of the log, never less.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence

from resilient_slurm.files import atomic_write, locked
from resilient_slurm.health.log_sources import Cursor
from resilient_slurm.health.verdict import HistoryEntry

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class NodeState:
    """The state directory of one node. Creating it creates the directories."""

    def __init__(self, state_dir: str, node: str) -> None:
        if not _SAFE_NAME.fullmatch(node):
            raise ValueError(f"node name {node!r} is not a Slurm node name (letters, digits, '.', '_', '-')")
        self.directory = os.path.join(state_dir, node)
        os.makedirs(os.path.join(self.directory, "runs"), exist_ok=True)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with locked(os.path.join(self.directory, ".lock")):
            yield

    def node_cursor(self) -> Cursor | None:
        return Cursor.from_json(self._load(os.path.join(self.directory, "cursor.json")))

    def save_node_cursor(self, cursor: Cursor) -> None:
        self._save(os.path.join(self.directory, "cursor.json"), cursor.to_json())

    def run_cursor(self, job_id: str, restart_count: int) -> Cursor | None:
        return Cursor.from_json(self._load(self._run_path(job_id, restart_count)))

    def save_run_cursor(self, job_id: str, restart_count: int, cursor: Cursor) -> None:
        self._save(self._run_path(job_id, restart_count), cursor.to_json())

    def drop_run_cursor(self, job_id: str, restart_count: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._run_path(job_id, restart_count))

    def history(self) -> list[HistoryEntry]:
        raw = self._load(os.path.join(self.directory, "history.json"))
        entries = [HistoryEntry.from_json(item) for item in raw] if isinstance(raw, list) else []
        return [entry for entry in entries if entry is not None]

    def save_history(self, entries: Sequence[HistoryEntry]) -> None:
        rows = [{"xid": e.xid, "gpu": e.gpu, "job": e.job, "time_s": e.time_s} for e in entries]
        self._save(os.path.join(self.directory, "history.json"), rows)

    def _run_path(self, job_id: str, restart_count: int) -> str:
        if not _SAFE_NAME.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r} is not a Slurm job id")
        return os.path.join(self.directory, "runs", f"{job_id}.{restart_count}.json")

    @staticmethod
    def _load(path: str) -> object:
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _save(path: str, value: object) -> None:
        atomic_write(path, json.dumps(value, indent=1).encode() + b"\n")
