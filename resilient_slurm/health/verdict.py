"""Judging a node: Xid events, GPU findings and the node's history → one verdict. Pure.

Application Xids and the benign ones do not take a node out alone; the same Xid on the same GPU
in a *different* job inside the history window does (the catalog row's `repeat_action`). A job
keeps its id across requeues, so a code bug that crashes every restart of one job never counts
as a repeat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from resilient_slurm.health.kernel_log import XidEvent
from resilient_slurm.health.xid_catalog import Action, XidRow, recovery_action, row_for

HISTORY_LIMIT = 1000
"""Newest history entries kept per node, so the file stays small whatever a GPU does."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One failed (or noteworthy) check: which check, what it found against what limit, and the
    action it asks for."""

    check: str
    action: Action
    detail: str
    xid: int | None = None
    gpu: str = ""

    def line(self) -> str:
        return f"{self.check}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The node's verdict: `ok` unless the worst finding takes the node out of service."""

    action: Action
    reason: str
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.action.takes_node_out

    @property
    def xid(self) -> int | None:
        """The Xid behind the worst finding, if it was an Xid."""
        return self.findings[0].xid if self.findings else None


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """Xid `xid` hit GPU `gpu` during job `job` (seen by a scan at `time_s`, epoch seconds)."""

    xid: int
    gpu: str
    job: str
    time_s: float

    @classmethod
    def from_json(cls, raw: object) -> HistoryEntry | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(int(raw["xid"]), str(raw["gpu"]), str(raw["job"]), float(raw["time_s"]))
        except (KeyError, TypeError, ValueError):
            return None


def event_action(event: XidEvent, row: XidRow) -> Action:
    """The action one event asks for: the row's, refined by what the line itself decodes to."""
    detail: Action | None = None
    if event.recovery_to is not None:
        detail = recovery_action(event.recovery_to)
    elif event.rst or event.d_rst:
        detail = Action.RESET_GPU
    elif event.link_fatal is not None:
        detail = Action.EXCLUDE if event.link_fatal else Action.KEEP
    if detail is None:
        return row.action
    return detail if row.detail_decides else max(row.action, detail)


def check_xid_events(
    events: Iterable[XidEvent],
    catalog: Mapping[int, XidRow],
    history: Sequence[HistoryEntry],
    job_id: str | None,
    now: float,
    window_s: float,
) -> list[Finding]:
    """One finding per (Xid, GPU), in order of first appearance, with its count and action.
    `history` counts only with a `job_id`: a scan outside a job has no job to differ from."""
    groups: dict[tuple[int, str], list[XidEvent]] = {}
    for event in events:
        groups.setdefault((event.xid, event.pci), []).append(event)
    findings = []
    for (xid, gpu), hits in groups.items():
        row = row_for(catalog, xid)
        action = max(event_action(event, row) for event in hits)
        first = hits[0]
        what = "fallen off the bus (no Xid line)" if first.bus_only else f"Xid {xid} {row.mnemonic}"
        where = gpu or "unknown GPU"
        if first.gpu_instance is not None:
            where += f" GPU-I:{first.gpu_instance}"
        detail = f"{what} on {where} x{len(hits)}: {first.text[:80]}"
        if row.repeat_action is not None and job_id is not None:
            others = sorted(
                {
                    h.job
                    for h in history
                    if h.xid == xid and h.gpu == gpu and h.job != job_id and now - h.time_s <= window_s
                }
            )
            if others:
                action = max(action, row.repeat_action)
                detail += f"; same GPU in job {', '.join(others[:3])} within {window_s / 3600:g} h"
        findings.append(Finding("check_xid", action, detail, xid=xid, gpu=gpu))
    return findings


def remember(
    history: Sequence[HistoryEntry],
    events: Iterable[XidEvent],
    catalog: Mapping[int, XidRow],
    job_id: str,
    now: float,
    window_s: float,
) -> list[HistoryEntry]:
    """`history` with this job's repeat-counted Xids added, entries older than the window
    dropped, one entry per (Xid, GPU, job), at most HISTORY_LIMIT, oldest first."""
    latest = {(h.xid, h.gpu, h.job): h for h in history if now - h.time_s <= window_s}
    for event in events:
        if row_for(catalog, event.xid).repeat_action is not None:
            latest[(event.xid, event.pci, job_id)] = HistoryEntry(event.xid, event.pci, job_id, now)
    return sorted(latest.values(), key=lambda h: h.time_s)[-HISTORY_LIMIT:]


def decide(findings: Sequence[Finding]) -> Verdict:
    """The worst finding decides; the reason is its line, plus how many others there were."""
    if not findings:
        return Verdict(Action.KEEP, "no GPU fault found")
    ordered = sorted(findings, key=lambda f: f.action, reverse=True)
    worst = ordered[0]
    more = f" (+{len(ordered) - 1} more)" if len(ordered) > 1 else ""
    return Verdict(worst.action, worst.line() + more, tuple(ordered))
