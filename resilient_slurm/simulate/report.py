"""The simulation as text: one strategy in detail, or a table across strategies. Pure."""

from __future__ import annotations

from resilient_slurm.simulate.costs import CAUSES
from resilient_slurm.simulate.results import Summary
from resilient_slurm.simulate.scenario import SOURCES, Scenario

CAUSE_TEXT = {
    "checkpoint": "saves blocking training",
    "memory_checkpoint": "memory-tier saves blocking training",
    "redone": "work lost since the last checkpoint",
    "detect": "detection: a hang's timeout (collective or heartbeat), a crash's",
    "scheduler": "Slurm's hold on a requeued job",
    "queue": "waiting for nodes",
    "teardown": "in-process restart: teardown",
    "placement": "in-process restart: placement",
    "startup": "process start (every rank's; in process, the replacement's)",
    "rendezvous": "in-process restart: rendezvous",
    "load_memory": "checkpoint load from the node's memory",
    "load_buddy": "checkpoint load from the buddy's memory (beyond the own node's)",
    "load": "checkpoint load (hot tier, disk)",
    "cold_fallback": "cold-tier load (a node's hot copy gone)",
    "data_ready": "in-process restart: data loader ready",
    "first_step": "in-process restart: first step beyond a steady one",
    "comm_init": "communicators created anew after a restart of the whole run",
    "quorum": "replica groups: quorum changes as a group leaves and joins",
    "degraded": "replica groups: slower steps while a group heals",
    "straggler": "slower steps while a straggler lasts",
    "sdc": "silent data corruption: rollbacks and work on corrupted weights",
    "sentinel": "the SDC sentinel's fingerprint checks",
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


def detail(summary: Summary, sources: dict[str, str] | None = None) -> str:
    s = summary.scenario
    pct = summary.goodput_pct
    lost = summary.lost_gpu_h()
    total = summary.total_lost_gpu_h()
    paid = summary.paid_gpu_h
    lines = [
        describe(s),
        f"strategy {summary.strategy}: {summary.label}; {len(summary.outcomes)} seeds",
        "",
        f"goodput (of the GPU-hours paid, spares included): mean {summary.goodput:.1%}   p10 {pct[10]:.1%}   "
        f"p50 {pct[50]:.1%}   p90 {pct[90]:.1%}",
        f"ETTR (MegaScale: iterations x iteration time / wall time): {summary.ettr:.1%}; goodput = ETTR x "
        f"{summary.job_share:.2%} (GPUs in the job / GPUs paid)",
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
    memory_interval = summary.mean_interval_s(memory=True)
    paths = summary.mean_counts("paths")
    lines += [
        "",
        "restarts per run (mean): " + _counts(summary.mean_counts("restarts")),
        *(["restart paths inside the allocation (mean): " + _counts(paths)] if paths else []),
        "interruptions per run (mean): " + _counts(summary.mean_counts("interruptions")),
        "nodes excluded per run (mean): " + (_counts(summary.mean_counts("excluded")) or "none"),
        f"saves per run (mean): {sum(o.saves for o in summary.outcomes) / len(summary.outcomes):,.0f}"
        + (f"; mean Young-Daly interval {interval:.0f} s" if interval else "")
        + (f"; memory tier {sum(o.memory_saves for o in summary.outcomes) / len(summary.outcomes):,.0f}, "
           f"every {memory_interval:.0f} s" if memory_interval else ""),
    ]
    if sources is not None:
        lines += ["", costs_table(s, sources)]
    return "\n".join(lines)


def costs_table(s: Scenario, sources: dict[str, str]) -> str:
    """Each cost the run used, and where it came from (measured, scaled, published, configured,
    assumed, given)."""
    lines = ["| cost | value | source |", "|---|---|---|"]
    for name in SOURCES:
        unit = " s" if name.endswith("_s") else " h" if name.endswith("_h") else ""
        lines.append(f"| {name} | {s.value(name):.4g}{unit} | {sources[name]} |")
    return "\n".join(lines)


def losses(summaries: list[Summary], sources: dict[str, str] | None = None) -> str:
    """Each loss's share of the paid GPU-hours, one column per strategy: what each step buys."""
    s = summaries[0].scenario
    lines = [
        describe(s),
        f"{len(summaries[0].outcomes)} seeds; share of the GPU-hours paid (spares included)",
        "",
        "| lost to | " + " | ".join(m.strategy for m in summaries) + " |",
        "|---|" + "---|" * len(summaries),
    ]
    lost = [m.lost_gpu_h() for m in summaries]
    for cause in CAUSES:
        if any(row[cause] > 0 for row in lost):
            lines.append(f"| {CAUSE_TEXT[cause]} | "
                         + " | ".join(f"{row[cause] / m.paid_gpu_h:.2%}" for row, m in zip(lost, summaries)) + " |")
    lines += ["| **goodput** | " + " | ".join(f"**{m.goodput:.1%}**" for m in summaries) + " |",
              "| ETTR (spares excluded) | " + " | ".join(f"{m.ettr:.1%}" for m in summaries) + " |",
              "| gave up per run | " + " | ".join(f"{m.mean_counts('restarts').get('gave up', 0.0):.1f}"
                                                 for m in summaries) + " |"]
    lines += ["", "; ".join(f"{m.strategy}: {m.label}" for m in summaries)]
    if sources is not None:
        lines += ["", costs_table(s, sources)]
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
