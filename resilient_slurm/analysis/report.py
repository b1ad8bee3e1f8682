"""`python -m resilient_slurm.report RUN_DIR [RUN_DIR ...]` (or `resilient-report`): what happened to a run.

For one run: a summary to read in a terminal (steps done, wall time, restarts by cause, steps
lost to faults, time lost to saves and restarts, goodput, the last checkpoint, the code, the
wandb segments or the MLflow run) and `report.png` in the run directory (the loss curve with
restarts, rollbacks and faults marked, and a timeline of productive and lost time). For several runs: the main figures
side by side, and a PNG for each.

Loading and summing up live in summary.py; the renderers here are pure.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from resilient_slurm.analysis import faults
from resilient_slurm.analysis.goodput import BREAKDOWN_PARTS, ReplicaChange, Restart
from resilient_slurm.analysis.summary import ReportError, Summary, load, summarize
from resilient_slurm.config import ConfigError
from resilient_slurm.console import pipe_safe
from resilient_slurm.tracking.mlflow_store import StoredRun, is_file_store
from resilient_slurm.ledger import EvalFailed, Sdc, select
from resilient_slurm.rundir.benchmarks import latest_by_step

PNG = "report.png"


def render(s: Summary) -> str:
    f, a, t = s.files, s.acc, s.acc.time
    lines = [f"run {f.meta.get('name', f.path.name)}  (id {f.meta['run_id']}, {f.path})"]

    def add(key: str, value: str) -> None:
        lines.append(f"  {key:<12}{value}")

    of = f"/{f.max_steps}" if f.max_steps else ""
    status = "finished" if a.finished else (a.attempts[-1].outcome if a.attempts else "never started")
    add("status", f"{status} at step {a.steps_done}{of}")
    if "parent" in f.meta:
        add("forked from", f"{f.meta['parent']['name']} (changed: {', '.join(f.meta['parent']['changed'])})")
    if "ablation" in f.meta:
        add("ablation", f"{f.meta['ablation']['group']} (baseline {f.meta['ablation']['baseline']})")
    if a.attempts:
        first, last = a.attempts[0], a.attempts[-1]
        add("started", f"{_clock(first.begin_s)}   last trace {_clock(last.end_s)}   wall time "
                       f"{_duration(last.end_s - first.begin_s)}")
    causes = ", ".join(f"{n} {c}" for c, n in sorted(a.restarts_by_cause.items()))
    add("attempts", f"{len(a.attempts)} ({a.restarts} restart{'s' if a.restarts != 1 else ''}"
                    f"{': ' + causes if causes else ''})")
    lines.extend(_restart_lines(a.restart_list))
    lines.extend(_fault_lines(f.events, f.kept))
    lines.extend(_sdc_lines(f.events))
    add("steps lost", f"{a.steps_lost} (computed again after faults, {_duration(t.redone_s)})")
    add("time", f"allocated {_duration(t.allocated_s)} = productive {_duration(t.productive_s)}"
                f" + redone {_duration(t.redone_s)} + saves {_duration(t.save_s)} + evaluation "
                f"{_duration(t.eval_s)} + restarts/other {_duration(t.other_s)}")
    add("", f"waiting between attempts (not allocated) {_duration(t.waiting_s)}")
    if a.degraded_steps:
        add("", f"degraded: {a.degraded_steps} step(s) short of a replica group, {_duration(t.degraded_s)} of "
                f"the productive time")
    lines.extend(_replica_lines(a.replica_changes))
    add("goodput", "-" if t.goodput is None else f"{100 * t.goodput:.1f}% (productive / allocated)")
    ckpt = a.last_checkpoint
    add("checkpoint", f"{ckpt['path']} (step {ckpt['step']}, {ckpt['reason']})" if ckpt else "none")
    if s.final:
        add("metrics", "   ".join(f"{k} {v:.4g} (step {step})" for k, (v, step) in s.final.items()))
    lines.extend(_benchmark_lines(s))
    lines.extend(_record_lines(f.record))
    if f.wandb_segments:
        add("wandb", f"{f.wandb_mode}, {len(f.wandb_segments)} segment(s) of run {f.meta['run_id']}; upload with")
        add("", f"wandb sync --id {f.meta['run_id']} -p {f.meta.get('experiment', '<project>')} "
                f"{f.path}/wandb/offline-run-*-{f.meta['run_id']}*")
    if f.mlflow:
        lines.extend(_mlflow_lines(f.mlflow))
    if a.attempts:
        lines.append("")
        lines.append(f"  {'attempt':<8}{'began':<10}{'duration':>9}  {'steps':<13}{'job':<10}ended")
        for x in a.attempts:
            job = f"{x.job_id}.{x.restart}" if x.job_id else "local"
            if x.job_id and x.job_step:
                job += f" s{x.job_step}"
            steps = f"{x.resumed_from} -> {x.last_step}"
            lines.append(f"  {x.index:<8}{_clock(x.begin_s)[11:19]:<10}{_duration(x.duration_s):>9}  "
                         f"{steps:<13}{job:<10}{x.outcome}")
    return "\n".join(lines) + "\n"


def render_side_by_side(summaries: list[Summary]) -> str:
    """The main figures of several runs, one column each."""
    def cell(s: Summary, key: str) -> str:
        a, t = s.acc, s.acc.time
        final = {k: f"{v:.4g}" for k, (v, _) in s.final.items()}
        return {
            "run": s.files.meta.get("name", s.files.path.name),
            "status": "finished" if a.finished else (a.attempts[-1].outcome if a.attempts else "never started"),
            "steps": str(a.steps_done), "restarts": _restart_count(a.restart_list), "steps lost": str(a.steps_lost),
            "allocated": _duration(t.allocated_s), "productive": _duration(t.productive_s),
            "goodput": "-" if t.goodput is None else f"{100 * t.goodput:.1f}%",
            "loss": final.get("loss", "-"), "val loss": final.get("val_loss", "-"),
            "exact match": final.get("exact_match", "-"),
            "checkpoint": str(a.last_checkpoint["step"]) if a.last_checkpoint else "-",
        }[key]

    keys = ["run", "status", "steps", "restarts", "steps lost", "allocated", "productive", "goodput", "loss",
            "val loss", "exact match", "checkpoint"]
    table = [[key] + [cell(s, key) for s in summaries] for key in keys]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table) + "\n"


def _mlflow_lines(m: StoredRun) -> list[str]:
    where = f"run {m.run_id} in {m.uri}"
    if m.error:
        return [f"  {'mlflow':<12}{where}: {m.error}"]
    lines = [f"  {'mlflow':<12}{m.status}, {m.steps} step(s) logged through step {m.last_step}; {where}"]
    if is_file_store(m.uri):
        lines.append(f"  {'':<12}browse with: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {m.uri}")
    elif m.uri.startswith("sqlite:"):
        lines.append(f"  {'':<12}browse with: mlflow ui --backend-store-uri {m.uri}")
    return lines


def _benchmark_lines(s: Summary) -> list[str]:
    """Each evaluated checkpoint's scores at its step, and the evaluations that failed for good."""
    out = [f"  {'benchmarks' if i == 0 else '':<12}step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items())
           for i, (step, scores) in enumerate(latest_by_step(s.files.benchmarks).items())]
    scored = {int(row["step"]) for row in s.files.benchmarks}
    for e in select(s.files.events, EvalFailed):
        if e.details.final and e.step not in scored:
            out.append(f"  {'benchmarks' if not out else '':<12}step {e.step}: failed ({e.details.error})")
    return out


def _fault_lines(events: list[Any], rows: list[dict[str, Any]]) -> list[str]:
    """Each hang with the ranks the others waited for; each straggler, and its swap's effect."""
    out = []
    for i, h in enumerate(faults.hangs(events)):
        who = ", ".join(f"rank {r}" + (f" ({h.nodes[0]})" if len(h.nodes) == 1 else "") for r in h.culprits)
        if len(h.nodes) > 1:
            who += f" on {', '.join(h.nodes)}"
        waited = f"; the others waited in collective {h.collective}" if h.collective else ""
        out.append(f"  {'hangs' if i == 0 else '':<12}step {h.step}: {who}{waited} (silent {_duration(h.waited_s)})")
    for i, s in enumerate(faults.stragglers(events, rows)):
        line = f"step {s.step}: rank {s.rank} on {s.node}, {s.ratio:.1f}x the others' compute"
        if s.swapped_for:
            line += f"; swapped for {', '.join(s.swapped_for)}, first step without it {_maybe(s.found_to_first_step_s)}" \
                    f" after it was found"
            if s.before is not None and s.after is not None:
                line += f"; tokens/s {s.before:.0f} -> {s.after:.0f}"
        else:
            line += f" ({s.action})"
        out.append(f"  {'stragglers' if i == 0 else '':<12}{line}")
    return out


def _sdc_lines(events: list[Any]) -> list[str]:
    """Each silent data corruption: where, on whom, how it was decided, and what became of it."""
    out = []
    for i, e in enumerate(select(events, Sdc)):
        d = e.details
        tensors = ", ".join(d.tensors[:3]) + (f" and {len(d.tensors) - 3} more" if len(d.tensors) > 3 else "")
        if d.action == "healed":
            who = ", ".join(f"rank {r} on {n}" for r, n in zip(d.ranks, d.nodes))
            what = f"{who} ({d.decided_by}: {d.reason}); healed from {d.source or 'nothing needed'}" \
                   f" in {d.heal_s or 0.0:.3f} s{', verified' if d.verified else ''}; node taken out"
        else:
            what = f"undecided ({d.reason}); suspects {', '.join(d.suspects)}; the attempt ended, to resume from " \
                   f"the newest checkpoint"
        out.append(f"  {'sdc' if i == 0 else '':<12}step {e.step}: {d.check} differed in {tensors}: {what}")
    return out


def _restart_count(restarts: list[Restart]) -> str:
    inside = sum(r.in_allocation for r in restarts)
    return f"{len(restarts)} ({inside} in allocation)" if inside else str(len(restarts))


def _restart_lines(restarts: list[Restart]) -> list[str]:
    """Restarts inside the allocation apart from those through the queue, each with its latency
    from the failure to the new process and to the first step."""
    out: list[str] = []
    for inside, label in ((True, "in allocation"), (False, "requeued or relaunched")):
        group = [r for r in restarts if r.in_allocation == inside]
        if not group:
            continue
        moves = Counter(r.move or r.cause for r in group) if inside else Counter(r.cause for r in group)
        kinds = ", ".join(f"{n} {m}" for m, n in sorted(moves.items()))
        latencies = ", ".join(f"{_maybe(r.process_s)} / {_maybe(r.first_step_s)}" for r in group)
        out.append(f"  {'restarts' if not out else '':<12}{label} {len(group)} ({kinds})")
        out.append(f"  {'':<14}failure -> new process / first step: {latencies}")
    return out + _breakdown_lines(restarts)


def _breakdown_lines(restarts: list[Restart]) -> list[str]:
    """A table of the restarts inside the allocation, part by part (seconds; parts may overlap)."""
    rows = [r for r in restarts if r.breakdown]
    if not rows:
        return []
    heads = ["attempt", "path", "move", *BREAKDOWN_PARTS, "source", "total"]
    table = [[f"#{r.index}", r.path or "-", r.move or "-",
              *("-" if (r.breakdown or {}).get(k) is None else f"{(r.breakdown or {})[k]:.2f}" for k in BREAKDOWN_PARTS),
              (r.breakdown or {}).get("load_source") or "-", _maybe(r.first_step_s)] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(heads)]
    out = [f"  {'':<12}restart breakdown (s): " + "  ".join(h.ljust(w) for h, w in zip(heads, widths))]
    out += [f"  {'':<12}{'':<23}" + "  ".join(c.ljust(w) for c, w in zip(t, widths)) for t in table]
    return out


def _replica_lines(changes: list[ReplicaChange]) -> list[str]:
    """Each replica group's leave, heal and join (none of them a restart of the run), and refusals."""
    out: list[str] = []
    for c in changes:
        who = "" if c.group is None else f"group {c.group} "
        at = "" if c.step is None else f" at step {c.step}"
        took = "" if c.seconds is None else f" {_duration(c.seconds)}"
        out.append(f"  {'replicas' if not out else '':<12}{who}{c.kind}{at}{took} ({c.detail})")
    return out


def _maybe(seconds: float | None) -> str:
    return "-" if seconds is None else _duration(seconds)


def _record_lines(record: list[dict[str, Any]]) -> list[str]:
    attempts = [r for r in record if r.get("kind") == "attempt"]
    if not attempts:
        return []
    last = attempts[-1]
    git = last.get("git") or {}
    commits = sorted({(a.get("git") or {}).get("commit") or "?" for a in attempts})
    code = (f"git {git['commit'][:12]} ({git.get('branch') or 'detached'}"
            f"{', diff ' + git['diff'] if git.get('diff') else ', clean'})" if git.get("commit")
            else f"no git state ({git.get('error')})")
    if len(commits) > 1:
        code += f"; the attempts ran {len(commits)} different commits"
    v = last.get("versions") or {}
    versions = ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "cuda", "nccl", "driver") if v.get(k))
    jobs = sorted({str(a["job_id"]) for a in attempts if a.get("job_id")})
    nodes = sorted({n for a in attempts for n in a.get("nodes", [])})
    return [f"  {'code':<12}{code}", f"  {'software':<12}{versions}",
            f"  {'placement':<12}{'jobs ' + ', '.join(jobs) + '; ' if jobs else ''}nodes {', '.join(nodes)}"]


def _clock(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    minutes, sec = divmod(round(s), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@pipe_safe
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resilient-report", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--no-png", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)
    try:
        summaries = [summarize(load(run)) for run in args.runs]
    except (ReportError, ConfigError) as e:
        print(f"resilient_slurm.report: {e}", file=sys.stderr)
        return 2
    if len(summaries) == 1:
        print(render(summaries[0]), end="")
    else:
        print(render_side_by_side(summaries), end="")
    if not args.no_png:
        from resilient_slurm.analysis.plot import plot

        for s in summaries:
            png = s.files.path / PNG
            plot(s, png)
            print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
