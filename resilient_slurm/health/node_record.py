"""The cluster's node record: every verdict against a node, across jobs, in one JSON-lines file on
shared storage (`health.node_record`).

Appended by many writers at once, on many nodes: the Epilog and the jobs' own health checks (an Xid
that takes a node out), the job's driver or local launcher (a straggler found, a hang's culprit),
and the silent-data-corruption sentinel (`append(path, Mark(node, SDC, ...))`). Each writer holds
`flock` on `<file>.lock` and writes its one line with a single `write` and an fsync, so lines never
interleave (flock works across nodes on NFSv4; Lustre needs its `flock` mount option). Readers do not
lock: a torn last line (a writer that died mid-write) is skipped, as is any line this version cannot
read. A new job's exclude list starts from the nodes whose marks pass `health.node_record_policy`
(`node_policy.excluded`). Standard library only: `tools/xid_scan` prints and appends it.

One line per mark:

    {"time": "2026-12-01T21:11:18.123Z", "at": 1764623478.123, "node": "n3", "kind": "straggler",
     "job_id": "42", "detail": {"ratio": 3.1, ...}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from resilient_slurm.files import locked, utc_stamp
from resilient_slurm.health.node_policy import CLEARED, HANG, KINDS, SDC, STRAGGLER, XID, Mark, excluded

__all__ = ["CLEARED", "HANG", "SDC", "STRAGGLER", "XID", "Mark", "append", "read", "excluded_now"]


def append(path: str, mark: Mark) -> None:
    """Add one mark; safe against concurrent writers on any host sharing the file."""
    if mark.kind not in KINDS:
        raise ValueError(f"node record: unknown kind {mark.kind!r}; use one of {', '.join(KINDS)}")
    line = json.dumps({"time": utc_stamp(mark.at), "at": mark.at, "node": mark.node, "kind": mark.kind,
                       "job_id": mark.job_id, "detail": dict(mark.detail or {})}, sort_keys=True) + "\n"
    with locked(path + ".lock"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def read(path: str) -> list[Mark]:
    """Every mark in the file, in the order written; a missing file is an empty record."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            d = json.loads(line)
            out.append(Mark(str(d["node"]), str(d["kind"]), float(d["at"]),
                            None if d.get("job_id") is None else str(d["job_id"]), d.get("detail") or {}))
        except (ValueError, KeyError, TypeError):
            continue  # a torn line, or a newer version's: never a reason to fail a job
    return out


def excluded_now(path: str, window_s: float, limits: Mapping[str, int], now: float) -> dict[str, str]:
    """The nodes the record keeps out of a new job at `now`, with their reasons."""
    return excluded(read(path), window_s, limits, now)
