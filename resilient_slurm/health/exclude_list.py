"""The run's exclude list: nodes a job must not run on, kept in one JSON file on shared storage.

Written by the Epilog (`tools/xid_scan --exclude-file F`) and by a job whose preflight refused
its node (`add`). Read by the launcher, which passes `exclude_value(...)` as `sbatch --exclude`
at submission, and by the requeue path, which sets it as `ExcNodeList` while the job is pending
(Slurm 22.05 accepts that after `scontrol requeue`, never on a running job).

File format:

    {"version": 1, "nodes": {"n3": {"reason": "...", "xid": 79, "job_id": "42",
                                    "added_s": 1764412800.0, "expires_s": 1764499200.0}}}

One entry per node; adding a node again replaces its entry. Times are epoch seconds. An entry
stops counting at `expires_s` and is dropped by the next write. Writers hold `flock` on
`<file>.lock` and replace the file atomically, so concurrent writers lose no entry and readers
always see a whole file.

Command line (the same entry point as the scan):

    tools/xid_scan exclude list   --file F
    tools/xid_scan exclude add    NODE --file F --reason TEXT [--xid N] [--job-id J] [--ttl-h H]
    tools/xid_scan exclude clear  [NODE ...] --file F      (no NODE: clear every entry)
    tools/xid_scan exclude render --file F                 (prints the --exclude value)
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping

from resilient_slurm.files import atomic_write, locked
from resilient_slurm.errors import InputError

DEFAULT_TTL_S = 24 * 3600.0
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ExcludeListError(InputError):
    """The exclude list cannot be used; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class ExcludeEntry:
    node: str
    reason: str
    xid: int | None
    job_id: str | None
    added_s: float
    expires_s: float

    def active(self, now: float) -> bool:
        return now < self.expires_s


def load(path: str) -> dict[str, ExcludeEntry]:
    """Every entry in the file, expired ones included; a missing file is an empty list.
    Raises ExcludeListError when the file is not an exclude list."""
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ExcludeListError(f"exclude list {path} is unreadable ({exc}): fix or remove it") from None
    nodes = raw.get("nodes") if isinstance(raw, dict) else None
    if not isinstance(nodes, dict):
        raise ExcludeListError(f'exclude list {path} has no "nodes" object: fix or remove it')
    try:
        return {
            node: ExcludeEntry(
                node,
                str(item["reason"]),
                None if item.get("xid") is None else int(item["xid"]),
                None if item.get("job_id") is None else str(item["job_id"]),
                float(item["added_s"]),
                float(item["expires_s"]),
            )
            for node, item in nodes.items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExcludeListError(f"exclude list {path} has a malformed entry ({exc!r}): fix or remove it") from None


def active(entries: Mapping[str, ExcludeEntry], now: float) -> list[ExcludeEntry]:
    """The entries still in force at `now`, by node name."""
    return sorted((e for e in entries.values() if e.active(now)), key=lambda e: e.node)


def exclude_value(entries: Mapping[str, ExcludeEntry], now: float) -> str:
    """The `sbatch --exclude` / `ExcNodeList` value: active nodes, comma-separated, or ""."""
    return ",".join(e.node for e in active(entries, now))


def add(
    path: str,
    node: str,
    *,
    reason: str,
    now: float,
    xid: int | None = None,
    job_id: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
) -> ExcludeEntry:
    """Put `node` on the list until `now + ttl_s`, replacing its earlier entry; drops expired
    entries on the way. Safe against concurrent writers on any host sharing the file."""
    entry = new_entry(node, reason=reason, now=now, xid=xid, job_id=job_id, ttl_s=ttl_s)
    with locked(path + ".lock"):
        _write(path, with_entry(load(path), entry, now))
    return entry


def new_entry(node: str, *, reason: str, now: float, xid: int | None = None, job_id: str | None = None,
              ttl_s: float = DEFAULT_TTL_S) -> ExcludeEntry:
    """The entry that keeps `node` out until `now + ttl_s`; raises ExcludeListError on a bad name or ttl."""
    if not _NODE.fullmatch(node):
        raise ExcludeListError(f"{node!r} is not a Slurm node name (letters, digits, '.', '_', '-')")
    if ttl_s <= 0:
        raise ExcludeListError(f"exclude ttl must be positive, got {ttl_s:g} s")
    return ExcludeEntry(node, " ".join(reason.split()), xid, job_id, now, now + ttl_s)


def with_entry(entries: Mapping[str, ExcludeEntry], entry: ExcludeEntry, now: float) -> dict[str, ExcludeEntry]:
    """The list after adding `entry`: it replaces the node's earlier entry, and expired entries
    are dropped. Pure: `add` writes its result, the simulator keeps it in memory."""
    kept = {n: e for n, e in entries.items() if e.active(now)}
    kept[entry.node] = entry
    return kept


def clear(path: str, nodes: Iterable[str] | None, now: float) -> list[str]:
    """Remove `nodes` (every node when None) and expired entries; returns the nodes removed."""
    with locked(path + ".lock"):
        entries = load(path)
        wanted = set(entries) if nodes is None else set(nodes)
        removed = sorted(n for n in entries if n in wanted or not entries[n].active(now))
        if removed:
            _write(path, {n: e for n, e in entries.items() if n not in removed})
    return removed


def _write(path: str, entries: Mapping[str, ExcludeEntry]) -> None:
    nodes = {
        e.node: {"reason": e.reason, "xid": e.xid, "job_id": e.job_id, "added_s": e.added_s, "expires_s": e.expires_s}
        for e in sorted(entries.values(), key=lambda e: e.node)
    }
    atomic_write(path, json.dumps({"version": 1, "nodes": nodes}, indent=1).encode() + b"\n")
