"""Does a benchmark evaluation beside training hold training up? The step time of the same run with
and without `eval.harness.every_steps`, side by side in one invocation.

    python bench/harness.py [--reps 2] [--steps 240] [--every 80] [--tasks tiny_mmlu,tiny_gsm8k] [--dir DIR]

Each rep launches the tiny_sft recipe (shrunk: 2 layers, width 64; checkpoints every 20 steps in
both modes, so only the evaluation differs) twice, `off` and `on`, in alternating order (ABBA), as
real runs (`python -m resilient_slurm.launch`, cluster=local): `on` starts a child process at every
`--every` steps that exports the checkpoint and runs lm-eval on it (the local launcher; on a Slurm
cluster it is a job on another node). From each run's metrics.jsonl:
- median step: the median `step_seconds` over all steps;
- median while evaluating: over the steps that ran while an evaluation was in flight (between its
  `eval_launched` and its `eval_done`/final `eval_failed` in the ledger); for `off`, the same step
  numbers as in the `on` run of that rep;
- p90 step, the run's wall time, and the evaluations that finished before the run did.
The table shows medians over reps. On this 2-core machine the child competes with training for the
CPU even at nice 19 (it shares the cores); that is the cost this measures. Numbers are for these
conditions only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = ["+experiment=tiny_sft", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
         "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64", "data.global_batch_size=4",
         "data.micro_batch_size=2", "optim.warmup_steps=10", "train.log_every_steps=1000", "eval.every_steps=0",
         "checkpoint.every_steps=20", "tracking.mode=disabled"]


def run(root: Path, name: str, steps: int, every: int, tasks: list[str]) -> dict[str, float]:
    extra = [f"eval.harness.tasks=[{','.join(tasks)}]", f"eval.harness.every_steps={every}",
             "eval.harness.dtype=float32", "eval.harness.limit=4"] if every else []
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.launch", *SMALL, f"train.max_steps={steps}",
                           f"run.root={root}", f"run.name={name}", *extra], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, WANDB_MODE="disabled"), timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rdir = root / "tiny_sft" / name
    rows = [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "rows": rows, "windows": eval_windows(rdir)}  # type: ignore[dict-item]


def eval_windows(rdir: Path) -> list[tuple[str, str]]:
    """(launched, ended) UTC stamps of each evaluation that ended; open ones run to the end of time."""
    events = [json.loads(line) for line in (rdir / "events.jsonl").read_text().splitlines()]
    launched = {e["step"]: e["time"] for e in events if e["event"] == "eval_launched"}
    ended = {e["step"]: e["time"] for e in events
             if e["event"] == "eval_done" or (e["event"] == "eval_failed" and e.get("final"))}
    return [(t, ended.get(step, "9999")) for step, t in launched.items()]


def summarize(result: dict, during_steps: set[int] | None = None) -> dict[str, float]:
    rows = result["rows"]
    times = [r["step_seconds"] for r in rows]
    if during_steps is None:
        during_steps = {r["step"] for r in rows if any(a <= r["time"] <= b for a, b in result["windows"])}
    during = [r["step_seconds"] for r in rows if r["step"] in during_steps] or [float("nan")]
    return {"median_s": statistics.median(times), "during_s": statistics.median(during),
            "p90_s": sorted(times)[int(0.9 * (len(times) - 1))], "wall_s": result["wall_s"],
            "evals": float(sum(b != "9999" for _, b in result["windows"])), "during_steps": during_steps}


def measure(root: Path, reps: int, steps: int, every: int, tasks: list[str]) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for rep in range(reps):
        order = ("off", "on") if rep % 2 == 0 else ("on", "off")
        results = {mode: run(root, f"{mode}{rep}", steps, every if mode == "on" else 0, tasks) for mode in order}
        on = summarize(results["on"])
        out["on"].append(on)
        out["off"].append(summarize(results["off"], on["during_steps"]))
    return out


def table(results: dict[str, list[dict[str, float]]]) -> str:
    cols = [("median step", "median_s", 1000, "ms"), ("median while evaluating", "during_s", 1000, "ms"),
            ("p90 step", "p90_s", 1000, "ms"), ("wall", "wall_s", 1, "s"), ("evaluations done", "evals", 1, "")]
    lines = ["| eval.harness | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for mode, label in (("off", "off"), ("on", "every N steps (local child)")):
        cells = []
        for _, key, scale, unit in cols:
            value = statistics.median(r[key] for r in results[mode]) * scale
            cells.append(f"{value:.0f}" if unit == "" else f"{value:.1f} {unit}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--every", type=int, default=80)
    parser.add_argument("--tasks", default="tiny_mmlu,tiny_gsm8k")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-harness-"))
    results = measure(root, args.reps, args.steps, args.every, args.tasks.split(","))
    print(f"{args.reps} rep(s) of {args.steps} steps, evaluation every {args.every} steps ({args.tasks}), "
          f"ABBA order, medians over reps; {os.cpu_count()} CPU(s)")
    print(table(results))


if __name__ == "__main__":
    main()
