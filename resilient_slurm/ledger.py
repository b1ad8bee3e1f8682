"""The run's ledger: `events.jsonl`, one JSON object per line, appended by every rank.

Each line has a UTC `time`, the `event` type, the `step` and the writing `rank`, plus details.
Lines are written with one `write()` on an O_APPEND descriptor, so concurrent ranks never
interleave within a line.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventLog:
    def __init__(self, path: Path, rank: int = 0, context: dict[str, Any] | None = None) -> None:
        self.path = path
        self.rank = rank
        self.context = dict(context or {})
        """Fields added to every event (attempt, job id)."""

    def emit(self, event: str, step: int | None, **details: Any) -> dict[str, Any]:
        record = {"time": utc_now(), "event": event, "step": step, "rank": self.rank, **self.context, **details}
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file; a torn line (a writer killed mid-line) is
    skipped, and no file means no lines."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_events(path: Path) -> list[dict[str, Any]]:
    """All events of a ledger."""
    return read_jsonl(path)
