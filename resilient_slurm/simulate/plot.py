"""A PNG timeline of one simulated run: surviving progress and nodes in use over the days, with
failures and time down marked. matplotlib is imported here only (Agg, no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from resilient_slurm.simulate.engine import Trace

DAY = 86400.0
COLORS = {"requeue": "tab:red", "requeue, excluding": "tab:red", "requeue, out of spares": "tab:red",
          "gave up": "black", "planned stop": "tab:purple", "load": "tab:orange"}


def timeline(trace: Trace, horizon_s: float, target_nodes: int, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = sorted(trace.samples)
    t = [x[0] / DAY for x in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=[3, 1])
    top.plot(t, [x[1] / 3600.0 for x in samples], lw=0.8, color="tab:blue", label="surviving work")
    top.plot([0, horizon_s / DAY], [0, horizon_s / 3600.0], lw=0.6, ls="--", color="grey", label="no failures")
    for begin, end, kind in trace.downs:
        top.axvspan(begin / DAY, end / DAY, color=COLORS.get(kind, "tab:green"), alpha=0.25, lw=0)
    for when, _ in trace.failures:
        top.axvline(when / DAY, ymax=0.04, color="tab:red", lw=0.5)
    top.set_ylabel("hours of full-size training")
    top.set_title("\n".join(textwrap.wrap(title, 150)), fontsize=8)
    top.legend(loc="upper left", fontsize=8)
    bottom.step(t, [x[2] for x in samples], where="post", lw=0.8, color="tab:green")
    bottom.set_ylim(min(x[2] for x in samples) - 1, target_nodes + 1)
    bottom.set_ylabel("nodes in use")
    bottom.set_xlabel("day (ticks at the bottom: failures; shading: down; red = requeue, green = restart in the "
                      "allocation, orange = load, black = gave up, purple = planned stop)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
