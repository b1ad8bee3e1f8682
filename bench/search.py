"""Search strategies at equal compute, from a deliberately poor learning-rate range.

    python bench/search.py [--members 6] [--max-steps 120] [--interval 30] [--parallel 2] [--seeds 1]
                           [--lr-range 1e-5,1e-4]

Runs four studies of `python -m resilient_slurm.sweep` on `+experiment=tiny_sft` with its model
shrunk further (hidden 64, 2 layers: a 120-step trial takes ~1.5 s of compute on one core), local
trials, `--parallel` at a time, each given the same budget of `members * max_steps` trial-steps:
- random: `members` trials of `max_steps`;
- tpe-median: Optuna's TPE with the median pruner, new trials until the budget is committed;
- asha: rungs every 3x from `interval` steps, promotions and new trials until the budget is committed;
- pbt: `members` members, exploit/explore every `interval` steps (x0.8/x1.2, resample 25%).
The space is `optim.lr=tag(log,interval(LOW,HIGH))`; the objective the validation loss at the last
step. Prints, per strategy: the best objective and the learning rate that trial ended with, the
trial-steps computed, the trial-steps pruning or early stopping saved (the steps a full run of each
stopped trial would still have taken), the trials, and the wall time (dominated by process start-up,
~4 s per launch here). With --seeds > 1, the order of the strategies alternates between seeds and
the medians are printed last.
"""

from __future__ import annotations

import os
import sys

# bench/ holds a tokenize.py that would shadow the standard library's: the repository root replaces it.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(sys.path[0])

from resilient_slurm.rundir.metrics import lost_path, read_metrics  # noqa: E402
from resilient_slurm.rundir.identity import load_config  # noqa: E402
from resilient_slurm.ledger import TrialPruned, read_events, select  # noqa: E402
from resilient_slurm.sweep.feed import steps_computed  # noqa: E402

MODEL = ["+experiment=tiny_sft", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
         "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64",
         "data.global_batch_size=4", "data.micro_batch_size=2", "train.log_every_steps=1000", "tracking.mode=disabled",
         "eval.task_samples=0", "data.val_samples=32", "train.threads=1"]


def strategies(a: argparse.Namespace) -> dict[str, list[str]]:
    budget = a.members * a.max_steps
    many = str(4 * a.members)
    return {
        "random": ["sweep=random", f"sweep.trials={a.members}"],
        "tpe-median": ["sweep=optuna", f"sweep.trials={many}", f"sweep.budget_steps={budget}",
                       "sweep.startup_trials=2", f"sweep.prune_after_steps={a.interval}"],
        "asha": ["sweep=asha", f"sweep.trials={many}", f"sweep.budget_steps={budget}", f"sweep.min_steps={a.interval}",
                 "sweep.reduction_factor=3"],
        "pbt": ["sweep=pbt", f"sweep.trials={a.members}", f"sweep.interval_steps={a.interval}"],
    }


def run(name: str, extra: list[str], a: argparse.Namespace, seed: int, root: Path) -> dict[str, float]:
    low, high = a.lr_range.split(",")
    argv = [sys.executable, "-m", "resilient_slurm.sweep", *MODEL, f"run.root={root}", f"train.max_steps={a.max_steps}",
            f"eval.every_steps={a.interval}", f"checkpoint.every_steps={a.interval}", f"sweep.parallel={a.parallel}",
            f"sweep.seed={seed}", f"train.seed={1234 + seed}", "sweep.poll_s=0.3", f"sweep.name={name}-{seed}",
            *extra, f"optim.lr=tag(log,interval({low},{high}))"]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, WANDB_MODE="disabled"))
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    study = root / "tiny_sft" / "sweeps" / f"{name}-{seed}"
    trials = sorted(p for p in study.parent.parent.glob(f"{name}-{seed}-*") if p.is_dir())
    spent = saved = 0
    best, best_lr = float("inf"), float("nan")
    for t in trials:
        kept = read_metrics(t / "metrics.jsonl")
        spent += steps_computed(kept, read_metrics(lost_path(t / "metrics.jsonl")))
        last = kept[-1] if kept else {}
        if last.get("step") == a.max_steps and last.get("val_loss", best) < best:
            best, best_lr = last["val_loss"], load_config(t).optim.lr  # PBT: the value it ended with
        if select(read_events(t / "events.jsonl"), TrialPruned):
            saved += a.max_steps - (last.get("step") or 0)
    return {"best": best, "lr": best_lr, "spent": spent, "saved": saved, "trials": len(trials), "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=6, help="random trials and PBT population; budget = this x steps")
    p.add_argument("--max-steps", type=int, default=120)
    p.add_argument("--interval", type=int, default=30, help="evaluation, PBT generation and first ASHA rung")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--lr-range", default="1e-5,1e-4", help="the poor range (the best lr here is ~1e-2)")
    a = p.parse_args()
    names = list(strategies(a))
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    print(f"budget {a.members * a.max_steps} trial-steps per strategy; lr in [{a.lr_range}]; "
          f"{a.parallel} trials in flight", flush=True)
    header = (f"{'seed':>4}  {'strategy':<11} {'best val_loss':>13} {'its lr':>8} {'spent':>6} {'saved':>6} {'trials':>6} "
              f"{'wall s':>7}")
    print(header)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        for seed in range(a.seeds):
            for name in (names if seed % 2 == 0 else names[::-1]):
                r = run(name, strategies(a)[name], a, seed, Path(tmp))
                results[name].append(r)
                print(f"{seed:>4}  {name:<11} {r['best']:>13.4f} {r['lr']:>8.2e} {r['spent']:>6.0f} {r['saved']:>6.0f} "
                      f"{r['trials']:>6.0f} {r['wall']:>7.1f}", flush=True)
    if a.seeds > 1:
        print("medians")
        for name in names:
            m = {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
            print(f"{'':>4}  {name:<11} {m['best']:>13.4f} {m['lr']:>8.2e} {m['spent']:>6.0f} {m['saved']:>6.0f} "
                  f"{m['trials']:>6.0f} {m['wall']:>7.1f}")


if __name__ == "__main__":
    main()
