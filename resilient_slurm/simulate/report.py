"""The simulation as text: one strategy in detail, or a table across strategies. Pure."""

from __future__ import annotations

from resilient_slurm.simulate.costs import CAUSES
from resilient_slurm.simulate.results import Summary
from resilient_slurm.simulate.scenario import Scenario

CAUSE_TEXT = {
    "checkpoint": "saves blocking training",
    "redone": "work lost since the last checkpoint",
    "detect": "hangs until the collective timeout",
    "scheduler": "Slurm's hold on a requeued job",
    "queue": "waiting for nodes",
    "startup": "process start",
    "load": "checkpoint load",
    "cold_fallback": "cold-tier load (a node's hot copy gone)",
    "shrink": "GPUs missing from a shrunk run",
    "manual": "job gave up: waiting for a person",
    "spares": "spare nodes held",
}


def describe(s: Scenario) -> str:
    return (f"{s.gpus:,} GPUs ({s.nodes:,} nodes x {s.gpus_per_node}), {s.days:g} days, per-GPU MTBF "
            f"{s.gpu_mtbf_h:,.0f} h (one failure every {s.job_mtbf_s / 60:.0f} min); save {s.save_s:g} s "
            f"(async blocks {s.blocking_s:g} s), load {s.load_s:g} s (cold {s.cold_load_s:g} s), start "
            f"{s.restart_s:g} s (in the allocation {s.in_alloc_restart_s:g} s), queue {s.queue_min_s / 60:g}-"
            f"{s.queue_max_s / 60:g} min + Slurm hold {s.cred_delay_s:g} s; {s.spares} spare nodes")


def detail(summary: Summary) -> str:
    s = summary.scenario
    pct = summary.goodput_pct
    lost = summary.lost_gpu_h()
    total = summary.total_lost_gpu_h()
    paid = summary.paid_gpu_h
    lines = [
        describe(s),
        f"strategy {summary.strategy}: {summary.label}; {len(summary.outcomes)} seeds",
        "",
        f"goodput (ETTR): mean {summary.goodput:.1%}   p10 {pct[10]:.1%}   p50 {pct[50]:.1%}   p90 {pct[90]:.1%}",
        f"paid: {paid:,.0f} GPU-h = {_money(paid * s.price)} at ${s.price:g}/GPU-h "
        f"({_money(paid * s.price_low)}-{_money(paid * s.price_high)} at ${s.price_low:g}-{s.price_high:g})",
        f"lost: {total:,.0f} GPU-h = {_money(total * s.price)} "
        f"({_money(total * s.price_low)}-{_money(total * s.price_high)})",
        "",
        "| lost to | GPU-h (mean) | share of paid | $ |",
        "|---|---|---|---|",
    ]
    for cause in CAUSES:
        if lost[cause] > 0:
            lines.append(f"| {CAUSE_TEXT[cause]} | {lost[cause]:,.0f} | {lost[cause] / paid:.2%} | "
                         f"{_money(lost[cause] * s.price)} |")
    interval = summary.mean_interval_s()
    lines += [
        "",
        "restarts per run (mean): " + _counts(summary.mean_counts("restarts")),
        "interruptions per run (mean): " + _counts(summary.mean_counts("interruptions")),
        "nodes excluded per run (mean): " + (_counts(summary.mean_counts("excluded")) or "none"),
        f"saves per run (mean): {sum(o.saves for o in summary.outcomes) / len(summary.outcomes):,.0f}"
        + (f"; mean Young-Daly interval {interval:.0f} s" if interval else ""),
    ]
    return "\n".join(lines)


def compare(summaries: list[Summary]) -> str:
    s = summaries[0].scenario
    lines = [
        describe(s),
        f"{len(summaries[0].outcomes)} seeds; $ at ${s.price:g}/GPU-h (range ${s.price_low:g}-{s.price_high:g})",
        "",
        "| strategy | what | goodput mean | p10 | p90 | lost GPU-h | $ lost | $ lost at 2-3 | restarts | gave up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in summaries:
        lost = m.total_lost_gpu_h()
        restarts = m.mean_counts("restarts")
        lines.append(
            f"| {m.strategy} | {m.label} | {m.goodput:.1%} | {m.goodput_pct[10]:.1%} | {m.goodput_pct[90]:.1%} | "
            f"{lost:,.0f} | {_money(lost * s.price)} | {_money(lost * s.price_low)}-{_money(lost * s.price_high)} | "
            f"{sum(restarts.values()):,.0f} | {restarts.get('gave up', 0.0):.1f} |")
    return "\n".join(lines)


def _counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:,.1f}" for k, v in counts.items())


def _money(dollars: float) -> str:
    return f"${dollars / 1e6:,.2f}M" if abs(dollars) >= 1e6 else f"${dollars:,.0f}"
