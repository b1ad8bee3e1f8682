"""The study's PNGs (matplotlib, imported here only): the optimisation history, the objective
against each parameter, parameter importances (Optuna's fANOVA, with three or more finished
trials), and for PBT each member's lineage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from resilient_slurm.ledger import Event, Exploit, select
from resilient_slurm.sweep.space import Dimension

if TYPE_CHECKING:
    from resilient_slurm.sweep.controller import TrialRun

_MIN_FOR_IMPORTANCE = 3


def draw(out: Path, study: optuna.Study, trials: list[TrialRun], dims: list[Dimension], metric: str,
         direction: str, events: list[Event[Any]], pbt: bool) -> list[Path]:
    """Write the plots that have data; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    done = [t for t in trials if t.result == "complete" and t.reported]
    written = [_history(out / "history.png", trials, metric, direction)]
    if done:
        written.append(_slices(out / "slices.png", done, dims, metric))
    if len(done) >= _MIN_FOR_IMPORTANCE and len(dims) > 1:
        written.append(_importance(out / "importance.png", study, metric))
    if pbt:
        written.append(_lineage(out / "lineage.png", trials, metric, events))
    return written


def _history(path: Path, trials: list[TrialRun], metric: str, direction: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    best: list[tuple[int, float]] = []
    for marker, result in (("o", "complete"), ("x", "pruned")):
        points = [(t.number, t.reported[max(t.reported)]) for t in trials if t.result == result and t.reported]
        if points:
            ax.scatter(*zip(*points), marker=marker, label=result)
    for t in sorted((t for t in trials if t.result == "complete" and t.reported), key=lambda t: t.number):
        value = t.reported[max(t.reported)]
        if not best or (value < best[-1][1] if direction == "minimize" else value > best[-1][1]):
            best.append((t.number, value))
        else:
            best.append((t.number, best[-1][1]))
    if best:
        ax.step(*zip(*best), where="post", color="k", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("optimisation history")
    ax.legend()
    return _save(fig, path)


def _slices(path: Path, done: list[TrialRun], dims: list[Dimension], metric: str) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(dims), figsize=(4 * len(dims), 3.5), squeeze=False)
    for ax, d in zip(axes[0], dims):
        xs = [t.params.get(d.key) for t in done]
        ys = [t.reported[max(t.reported)] for t in done]
        if d.is_choice:
            labels = [str(c) for c in d.choices]
            ax.scatter([labels.index(str(x)) if str(x) in labels else -1 for x in xs], ys)
            ax.set_xticks(range(len(labels)), labels)
        else:
            ax.scatter(xs, ys)
            if d.log:
                ax.set_xscale("log")
        ax.set_xlabel(d.key)
        ax.set_ylabel(metric)
    fig.suptitle("objective by parameter")
    return _save(fig, path)


def _importance(path: Path, study: optuna.Study, metric: str) -> Path:
    import matplotlib.pyplot as plt

    importance = optuna.importance.get_param_importances(study)
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.5 * len(importance)))
    names = list(importance)[::-1]
    ax.barh(names, [importance[n] for n in names])
    ax.set_xlabel(f"importance for {metric} (fANOVA)")
    return _save(fig, path)


def _lineage(path: Path, trials: list[TrialRun], metric: str, events: list[Event[Any]]) -> Path:
    """Each member's objective over steps; a dashed line where it continued from another's checkpoint."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {}
    exploits = select(events, Exploit)
    for t in sorted(trials, key=lambda t: t.number):
        # Broken where it took another member's checkpoint: the curve after is the donor's line.
        cuts = sorted({e.step for e in exploits if e.details.recipient_trial == t.number and e.step is not None})
        steps = sorted(t.reported)
        color = None
        for low, high in zip([0, *cuts], [*cuts, max(steps, default=0)]):
            part = [s for s in steps if low < s <= high] if low else [s for s in steps if s <= high]
            if part:
                line, = ax.plot(part, [t.reported[s] for s in part], marker=".", color=color,
                                label=None if color else t.run)
                color = line.get_color()
        colors[t.number] = color
    by_number = {t.number: t for t in trials}
    for e in exploits:
        donor, recipient, step = by_number.get(e.details.donor_trial), by_number.get(e.details.recipient_trial), e.step
        if donor is None or recipient is None or step is None:
            continue
        donor_y = donor.reported.get(step)
        after = [s for s in sorted(recipient.reported) if s > step]
        if donor_y is None or not after:
            continue
        ax.plot([step, after[0]], [donor_y, recipient.reported[after[0]]], "--", color=colors[recipient.number])
        ax.annotate(f"{donor.number}->{recipient.number}", (step, donor_y), fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title("PBT lineage (dashed: continued from another member's checkpoint)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
