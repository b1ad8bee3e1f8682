"""The built-in trainer at each layout of 4 ranks on this CPU (gloo), at a tiny size, side by side.

    python bench/parallel.py [--layouts dp4,dp2xtp2,hsdp2x2] [--reps 2] [--steps 16] [--hidden 128]
                             [--layers 4] [--seq 128] [--no-reshard] [--no-compile] [--with-pp] [--dir DIR]

Each row is a real run (`python -m resilient_slurm.launch +experiment=tiny_sft ...`, every rank
a process): it trains half its steps, saves and stops (`train.pause_at_step`: a synchronous save),
and a second start loads that checkpoint and trains the rest. From its ledger and metrics:
- step time: the median of `step_seconds` over the steps after the first two of each start;
- peak RSS: the largest rank process's peak resident memory (ru_maxrss of the finished processes;
  torch's own libraries, about 300 MB, included), beside `--plan`'s estimate of what the state and
  a micro-batch's activations take;
- checkpoint bytes per rank: the save's bytes over the ranks (each chunk is written once, spread
  over its holders), beside `--plan`'s per-rank estimate; save time (the pause's synchronous save)
  and load time (the resume's);
- resharding: one run paused and resumed at 4 (dp 2 x tp 2) -> 2 (tp 2) -> 1 -> 4 (hsdp 2 x 2)
  ranks, each load's time;
- compiled vs eager: dp 2 x tp 2 with `model.compile=true` (each decoder layer, inductor on this
  CPU): the median step after the first two (the first pays the compilation, printed apart);
- `--plan` for llama70b_pretrain at 10,000 GPUs.
Layouts alternate their order between repetitions; medians over repetitions. Pipeline rows (pp 2 x
dp 2, tp 2 x pp 2) run with --with-pp once pipeline parallelism is in the trainer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resilient_slurm.exit_codes import ExitCode  # noqa: E402
from resilient_slurm.ledger import Kind, read_events  # noqa: E402

LAYOUTS = {
    "dp4": ["cluster.ranks=4"],
    "dp2xtp2": ["cluster.ranks=4", "parallel.tp=2"],
    "hsdp2x2": ["cluster.ranks=4", "parallel.dp_replicate=2"],
}
PIPELINE = {
    "pp2xdp2": ["cluster.ranks=4", "parallel.pp=2"],
    "tp2xpp2": ["cluster.ranks=4", "parallel.tp=2", "parallel.pp=2"],
}
RESHARD = [("4 ranks, dp 2 x tp 2", LAYOUTS["dp2xtp2"]), ("2 ranks, tp 2", ["cluster.ranks=2", "parallel.tp=2"]),
           ("1 rank", ["cluster.ranks=1"]), ("4 ranks, hsdp 2 x 2", LAYOUTS["hsdp2x2"])]
MB = 1e6


@dataclass(frozen=True)
class Start:
    """One start of a run, read back from its ledger and metrics."""

    step_s: list[float]
    save_s: float | None
    save_bytes: int | None
    load_s: float | None
    world: int
    peak_rss: int
    first_step_s: float | None


def model_args(args: argparse.Namespace) -> list[str]:
    heads = max(args.hidden // 32, 2)
    return ["+experiment=tiny_sft", f"model.hidden_size={args.hidden}", f"model.intermediate_size={args.hidden * 3}",
            f"model.num_layers={args.layers}", f"model.num_heads={heads}", f"model.num_kv_heads={heads}",
            f"data.seq_len={args.seq}", "data.global_batch_size=8", "data.micro_batch_size=1", "eval.every_steps=0",
            "optim.warmup_steps=2", f"train.max_steps={args.steps}", "checkpoint.every_steps=0",
            "checkpoint.async_save=false", "checkpoint.save_final=false", "train.log_every_steps=1000"]


def start(root: Path, name: str, overrides: list[str]) -> Start:
    """One launch, in a process of its own so that its children's peak RSS is this run's alone."""
    rdir = root / "tiny_sft" / name
    before = _steps(rdir)
    probe = ("import resource, subprocess, sys\n"
             "code = subprocess.run(sys.argv[1:]).returncode\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "resilient_slurm.launch", *overrides,
                           f"run.root={root}", f"run.name={name}"], cwd=REPO, capture_output=True, text=True)
    if done.returncode not in (ExitCode.DONE, ExitCode.RESUME):  # RESUME: after a pause
        raise SystemExit(f"bench/parallel.py: {name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = [r for r in _metrics(rdir) if r["step"] > before]
    events = read_events(rdir / "events.jsonl")
    starts = [i for i, e in enumerate(events) if e.kind is Kind.START]
    mine = events[starts[-1]:]
    saves = [e for e in mine if e.kind is Kind.SAVE and e.details.reason == "pause"]
    resumes = [e for e in mine if e.kind is Kind.RESUME]
    return Start(step_s=[r["step_seconds"] for r in rows[2:]], save_s=saves[0].details.seconds if saves else None,
                 save_bytes=saves[0].details.bytes if saves else None,
                 load_s=resumes[0].details.seconds if resumes else None, world=events[starts[-1]].details.world_size,
                 peak_rss=int(done.stdout.split()[-1]) * 1024, first_step_s=rows[0]["step_seconds"] if rows else None)


def _metrics(rdir: Path) -> list[dict]:
    path = rdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _steps(rdir: Path) -> int:
    rows = _metrics(rdir)
    return rows[-1]["step"] if rows else 0


def plan(overrides: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.launch", *overrides, "--plan"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return done.stdout


def plan_figures(text: str) -> dict[str, str]:
    """The plan's peak estimate and its checkpoint bytes per rank, as printed."""
    out = {}
    for line in text.splitlines():
        if line.strip().startswith("peak estimate"):
            out["peak"] = " ".join(line.split()[-2:])
        if line.startswith("checkpoint:"):
            out["ckpt"] = line.split(":", 1)[1].split(" written")[0].strip()
    return out


def layout_row(root: Path, name: str, overrides: list[str], args: argparse.Namespace, rep: int) -> dict:
    base = [*model_args(args), *overrides]
    run = f"{name}-{rep}"
    first = start(root, run, [*base, f"train.pause_at_step={args.steps // 2}"])
    second = start(root, run, base)
    assert first.save_bytes is not None and first.save_s is not None and second.load_s is not None
    return {"step_s": statistics.median(first.step_s + second.step_s), "peak_rss": max(first.peak_rss, second.peak_rss),
            "ckpt_per_rank": first.save_bytes / first.world, "save_s": first.save_s, "load_s": second.load_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--no-reshard", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--with-pp", action="store_true", help="also the pipeline rows")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    layouts = {**LAYOUTS, **PIPELINE}
    names = [n for n in args.layouts.split(",") if n] + (list(PIPELINE) if args.with_pp else [])
    unknown = [n for n in names if n not in layouts]
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; choose from {', '.join(layouts)}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"bench/parallel.py: tiny_sft at hidden {args.hidden}, {args.layers} layers, seq {args.seq}, global batch "
              f"8, micro-batch 1, {args.steps} steps (a pause and a resume halfway), {args.reps} rep(s), gloo on this "
              f"CPU; medians")
        rows: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(args.reps):
            for name in (names if rep % 2 == 0 else names[::-1]):
                rows[name].append(layout_row(root, name, layouts[name], args, rep))
        print("| layout | step s | peak RSS MB (largest rank) | --plan peak (state + activations) | checkpoint MB per "
              "rank | --plan per rank | save s | load s |")
        print("|---|---|---|---|---|---|---|---|")
        for name in names:
            med = {k: statistics.median(r[k] for r in rows[name]) for k in rows[name][0]}
            figures = plan_figures(plan([*model_args(args), *layouts[name]]))
            print(f"| {name} | {med['step_s']:.4f} | {med['peak_rss'] / MB:.0f} | {figures['peak']} | "
                  f"{med['ckpt_per_rank'] / MB:.3f} | {figures['ckpt']} | {med['save_s']:.3f} | {med['load_s']:.3f} |")
        if not args.no_reshard:
            reshard(root, args)
        if not args.no_compile:
            compiled(root, args)
    print()
    print("--plan for llama70b_pretrain (10,000 GPUs):")
    print(plan(["+experiment=llama70b_pretrain"]), end="")


def reshard(root: Path, args: argparse.Namespace) -> None:
    print()
    print("| resharding | world | load s (the previous layout's checkpoint) | step s |")
    print("|---|---|---|---|")
    quarter = args.steps // 4
    for i, (what, overrides) in enumerate(RESHARD):
        pause = [f"train.pause_at_step={quarter * (i + 1)}"] if i < len(RESHARD) - 1 else []
        s = start(root, "reshard", [*model_args(args), *overrides, *pause])
        load = f"{s.load_s:.3f}" if s.load_s is not None else "(fresh start)"
        print(f"| {what} | {s.world} | {load} | {statistics.median(s.step_s) if s.step_s else float('nan'):.4f} |")


def compiled(root: Path, args: argparse.Namespace) -> None:
    print()
    print("| dp 2 x tp 2 | step s (median after the first two) | first step s |")
    print("|---|---|---|")
    got: dict[str, list[Start]] = {"eager": [], "compiled": []}
    for rep in range(args.reps):
        for what in (("eager", "compiled") if rep % 2 == 0 else ("compiled", "eager")):
            flag = ["model.compile=true"] if what == "compiled" else []
            got[what].append(start(root, f"{what}-{rep}", [*model_args(args), *LAYOUTS["dp2xtp2"], *flag]))
    for what, starts in got.items():
        step = statistics.median(s for st in starts for s in st.step_s)
        first = statistics.median(st.first_step_s for st in starts if st.first_step_s is not None)
        print(f"| {what} | {step:.4f} | {first:.2f} |")


if __name__ == "__main__":
    main()
