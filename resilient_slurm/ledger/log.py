"""Writing and reading the ledger: one line per event, parsed back into typed events.

Lines are written with one `write()` on an O_APPEND descriptor, so concurrent ranks never interleave
within a line. Reading is tolerant, because a ledger outlives the code that wrote it: a field a line
lacks reads as None, fields the catalog does not know are kept in `Event.record`, and a kind it does
not know reads as `Unknown`.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

from resilient_slurm.files import utc_stamp
# Imported for their side effect: every kind's class must exist before CATALOG is built from them.
from resilient_slurm.ledger import (  # noqa: F401
    eval_events, fault_events, launch_events, replica_events, save_events, sweep_events)
from resilient_slurm.ledger.kinds import Details, Kind

LEDGER_FILE = "events.jsonl"
"""The ledger's name, in a run directory and in a search's study directory."""


@dataclass(frozen=True, kw_only=True)
class Unknown(Details):
    """A kind this version does not know (written by a newer one); its fields are in `record`."""

    KIND = Kind.UNKNOWN


CATALOG: dict[Kind, type[Details]] = {cls.KIND: cls for cls in Details.__subclasses__()}
FAILURES = (Kind.CRASH, Kind.HANG, Kind.OUT_OF_MEMORY, Kind.HOST_OOM)
"""Events that mean an attempt failed."""

D = TypeVar("D", bound=Details)


@dataclass(frozen=True)
class Event(Generic[D]):
    """One ledger line: the header every line has, and the typed fields of its kind."""

    details: D
    time: str
    step: int | None
    rank: int
    job_id: str | None = None
    restart: int | None = None
    """SLURM_RESTART_COUNT: how often the job was requeued."""
    job_step: int | None = None
    """The Slurm job step the rank runs in: a new one for each start inside the same allocation."""
    node: str | None = None
    record: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The line as read or written, every field included."""

    @property
    def kind(self) -> Kind:
        return self.details.KIND


def parse(record: dict[str, Any]) -> Event[Details]:
    """One ledger line (a dict) as an Event."""
    try:
        kind = Kind(record.get("event"))
    except ValueError:
        kind = Kind.UNKNOWN
    cls = CATALOG[kind]
    values = {}
    for f in fields(cls):
        if f.name in record:
            values[f.name] = record[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            values[f.name] = None  # an older or torn writer: absent reads as None
    restart, job_step = record.get("restart"), record.get("job_step")
    return Event(
        details=cls(**values), time=str(record.get("time", "")), step=record.get("step"),
        rank=int(record.get("rank", 0)), job_id=None if record.get("job_id") is None else str(record["job_id"]),
        restart=None if restart is None else int(restart), job_step=None if job_step is None else int(job_step),
        node=record.get("node"), record=dict(record),
    )


def select(events: list[Event[Any]], cls: type[D]) -> list[Event[D]]:
    """The events of one kind, typed as that kind."""
    return [e for e in events if isinstance(e.details, cls)]


class EventLog:
    def __init__(self, path: Path, rank: int = 0, context: dict[str, Any] | None = None) -> None:
        self.path = path
        self.rank = rank
        self.context = dict(context or {})
        """Header fields added to every event (job_id, restart, job_step, node)."""

    def emit(self, details: Details, step: int | None) -> Event[Details]:
        """Append one event. Optional fields left at None are not written."""
        body = {}
        for f in fields(details):
            value = getattr(details, f.name)
            if value is None and f.default is None:
                continue
            body[f.name] = value
        record = {"time": utc_stamp(), "event": details.KIND.value, "step": step, "rank": self.rank, **self.context,
                  **body}
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return parse(json.loads(line))


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


def read_events(path: Path) -> list[Event[Details]]:
    """Every event of a ledger, in order."""
    return [parse(r) for r in read_jsonl(path) if isinstance(r, dict)]


def read_new_events(path: Path, offset: int) -> tuple[list[Event[Details]], int]:
    """The events written from byte `offset` on, and the offset to read from next: a reader that
    polls a growing ledger reads each line once. A line still being written waits for the next call."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    events = []
    for line in whole.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            events.append(parse(record))
    return events, offset + len(whole)
