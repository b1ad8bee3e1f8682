"""`report.png`: the loss curve with restarts, rollbacks and faults marked, over a timeline of
productive and lost time. matplotlib (Agg, no display) is imported here only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resilient_slurm.analysis.goodput import BREAKDOWN_PARTS
from resilient_slurm.analysis.summary import Summary
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import Save, select

# Spans closer than this on the timeline are drawn as one bar (the steps of one stretch of training).
_MERGE_GAP_S = 1.0
_COLORS = {"allocated": "#dddddd", "productive": "#2ca02c", "redone": "#d62728", "saves": "#1f77b4",
           "evaluation": "#9467bd"}


def timeline(s: Summary) -> dict[str, list[tuple[float, float]]]:
    """(start, width) spans in seconds since the first attempt began, per kind of time. Pure."""
    a = s.acc
    if not a.attempts:
        return {}
    zero = a.attempts[0].begin_s
    spans: dict[str, list[tuple[float, float]]] = {k: [] for k in _COLORS}
    spans["allocated"] = [(x.begin_s - zero, x.duration_s) for x in a.attempts]
    for kind, rows in (("productive", s.files.kept), ("redone", s.files.lost)):
        for row in sorted((r for r in rows if "time" in r), key=lambda r: r["time"]):
            end = stamp_seconds(row["time"]) - zero - row.get("eval_seconds", 0.0)
            spans[kind].append((end - row.get("step_seconds", 0.0), row.get("step_seconds", 0.0)))
            if row.get("eval_seconds"):
                spans["evaluation"].append((end, row["eval_seconds"]))
    for e in select(s.files.events, Save):
        if e.details.seconds:
            spans["saves"].append((stamp_seconds(e.time) - zero - e.details.seconds, e.details.seconds))
    # Attempts stay separate bars however close; the rest merge into stretches.
    return {k: v if k == "allocated" else _merge(v) for k, v in spans.items()}


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, width in sorted(spans):
        if out and start - (out[-1][0] + out[-1][1]) < _MERGE_GAP_S:
            out[-1] = (out[-1][0], max(out[-1][1], start + width - out[-1][0]))
        else:
            out.append((start, width))
    return out


def plot(s: Summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    broken_down = [r for r in s.acc.restart_list if r.breakdown]
    ratios = [3, 1.2] + ([0.4 + 0.3 * len(broken_down)] if broken_down else [])
    fig, axes = plt.subplots(len(ratios), 1, figsize=(11, 7.5 + 2 * bool(broken_down)),
                             gridspec_kw={"height_ratios": ratios})
    _loss(axes[0], s)
    _timeline(axes[1], s)
    if broken_down:
        _restart_parts(axes[2], broken_down)
    fig.suptitle(f"{s.files.meta.get('name', s.files.path.name)}  (goodput "
                 f"{'-' if s.acc.time.goodput is None else f'{100 * s.acc.time.goodput:.1f}%'})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _loss(ax: Any, s: Summary) -> None:
    kept = [r for r in s.files.kept if r.get("loss") is not None]
    ax.plot([r["step"] for r in kept], [r["loss"] for r in kept], color="#2ca02c", lw=1, label="train loss")
    lost = sorted((r for r in s.files.lost if r.get("loss") is not None), key=lambda r: r.get("time", ""))
    if lost:
        ax.plot([r["step"] for r in lost], [r["loss"] for r in lost], ".", color="#d62728", ms=4, alpha=0.6,
                label="lost steps (redone)")
    val = [r for r in s.files.kept if r.get("val_loss") is not None]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color="#ff7f0e", ms=4, label="val loss")
    marks = s.acc.marks
    for i, (lo, hi) in enumerate(marks.rollbacks):
        ax.axvspan(lo, hi, color="#d62728", alpha=0.12, label="rolled back" if i == 0 else None)
    for i, (step, cause) in enumerate(marks.restarts):
        ax.axvline(step, color="black", ls="--", lw=1, label="restart" if i == 0 else None)
        ax.annotate(cause, (step, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=8)
    for i, (step, outcome) in enumerate(marks.faults):
        ax.axvline(step, color="#d62728", lw=1.5, label="fault" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right", fontsize=8)


def _timeline(ax: Any, s: Summary) -> None:
    spans = timeline(s)
    lanes = [("allocated", 3), ("productive", 2), ("redone", 2), ("evaluation", 1), ("saves", 1)]
    for kind, lane in lanes:
        if spans.get(kind):
            ax.broken_barh(spans[kind], (lane - 0.4, 0.8), facecolor=_COLORS[kind], label=kind,
                           edgecolor="#555555" if kind == "allocated" else "none", linewidth=0.5)
    for attempt, (start, width) in zip(s.acc.attempts, spans.get("allocated", [])):
        ax.text(start + width / 2, 3, str(attempt.index), ha="center", va="center", fontsize=8)
    ax.set_yticks([1, 2, 3], ["saves / eval", "steps", "attempts"])
    ax.set_xlabel("seconds since the first attempt began")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=8, ncol=5, frameon=False)


_PART_COLORS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#1f77b4", "#9467bd", "#2ca02c")


def _restart_parts(ax: Any, restarts: list[Any]) -> None:
    """Each restart inside the allocation as one stacked bar of its parts (supervise/restarts.py).
    Parts may overlap in time (survivors tear down while the driver decides), so a bar can be
    longer than the restart's latency, which the black tick marks."""
    for y, r in enumerate(restarts):
        left = 0.0
        for part, color in zip(BREAKDOWN_PARTS, _PART_COLORS):
            width = (r.breakdown or {}).get(part) or 0.0
            ax.barh(y, width, left=left, color=color, label=part if y == 0 else None)
            left += width
        if r.first_step_s is not None:
            ax.plot([r.first_step_s] * 2, [y - 0.4, y + 0.4], color="black", lw=2)
    ax.set_yticks(range(len(restarts)), [f"#{r.index} {r.path or ''} {r.move or ''}" for r in restarts], fontsize=8)
    ax.set_xlabel("seconds of each restart inside the allocation, part by part (tick: failure to first step)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), fontsize=8, ncol=8, frameon=False)
