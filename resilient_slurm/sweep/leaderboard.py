"""The leaderboard: one row per trial (rank, trial, run, status, objective, steps, parameters,
hours, GPU-hours, jobs, lineage), written to `leaderboard.csv` and printed."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilient_slurm.analysis.summary import ReportError, load, summarize
from resilient_slurm.ledger import Event, Exploit, select
from resilient_slurm.sweep.feed import final_value

if TYPE_CHECKING:
    from resilient_slurm.sweep.controller import TrialRun

_PRINTED = 20


@dataclass(frozen=True)
class Row:
    rank: int | None
    trial: int
    run: str
    status: str
    objective: float | None
    steps: int
    params: dict[str, Any]
    hours: float
    gpu_hours: float
    jobs: list[str]
    lineage: str


def rows(trials: Iterable[TrialRun], direction: str, gpus: int, events: list[Event[Any]]) -> list[Row]:
    """Finished trials ranked by objective, then the rest (best objective so far first)."""
    out = []
    for t in trials:
        hours = 0.0
        try:
            hours = summarize(load(t.run_dir)).acc.time.allocated_s / 3600.0
        except (ReportError, OSError, KeyError, ValueError):
            pass  # never launched (a config that did not validate): no time spent
        lineage = "; ".join(f"g{e.details.generation}: {e.details.donor}@{e.step}"
                            for e in select(events, Exploit) if e.details.recipient_trial == t.number)
        status = t.result or t.status.value
        out.append(Row(None, t.number, t.run, status, final_value(t.reported), t.step, dict(t.params), hours,
                       hours * gpus, list(t.jobs), lineage))
    sign = 1.0 if direction == "minimize" else -1.0

    def key(r: Row) -> tuple[int, float, int]:
        return (r.status != "complete", sign * r.objective if r.objective is not None else float("inf"), r.trial)

    ordered = sorted(out, key=key)
    return [_ranked(r, i) for i, r in enumerate(ordered)]


def _ranked(r: Row, i: int) -> Row:
    return Row(i + 1 if r.status == "complete" else None, r.trial, r.run, r.status, r.objective, r.steps, r.params,
               r.hours, r.gpu_hours, r.jobs, r.lineage)


def write_csv(path: Path, table: list[Row], keys: list[str]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "trial", "run", "status", "objective", "steps", *keys, "hours", "gpu_hours", "jobs",
                    "lineage"])
        for r in table:
            w.writerow([r.rank or "", r.trial, r.run, r.status, "" if r.objective is None else f"{r.objective:.6g}",
                        r.steps, *(r.params.get(k, "") for k in keys), f"{r.hours:.4f}", f"{r.gpu_hours:.4f}",
                        " ".join(r.jobs), r.lineage])
    tmp.replace(path)


def render(table: list[Row], keys: list[str], metric: str, limit: int = _PRINTED) -> str:
    """The table as text, best first, at most `limit` rows."""
    head = ["rank", "trial", "run", "status", metric, "steps", *(k.rsplit(".", 1)[-1] for k in keys), "hours",
            "gpu_h"]
    body = [[str(r.rank or "-"), str(r.trial), r.run, r.status, "-" if r.objective is None else f"{r.objective:.5g}",
             str(r.steps), *(_short(r.params.get(k)) for k in keys), f"{r.hours:.3f}", f"{r.gpu_hours:.3f}"]
            for r in table[:limit]]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    if len(table) > limit:
        lines.append(f"... {len(table) - limit} more in leaderboard.csv")
    return "\n".join(lines)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
