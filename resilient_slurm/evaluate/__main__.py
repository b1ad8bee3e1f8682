"""`python -m resilient_slurm.evaluate RUN_DIR --step N [--tasks a,b] [--device cpu|cuda]`: benchmark a
checkpoint of a run with lm-evaluation-harness (export to Hugging Face layout, then lm-eval), the same
evaluation a run with `eval.harness.every_steps` starts by itself. Scores are appended to the run's
benchmarks.jsonl at the checkpoint's step and printed.

Needs lm-eval: pip install 'resilient-slurm[eval]'. Tasks: tiny_mmlu and tiny_gsm8k (shipped), the
YAMLs of the run's eval.harness.include_path, or any lm-eval task whose data is already local.

Exit status: 0 scored, 1 the evaluation failed (twice), 2 usage or lm-eval not installed."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--step", type=int, required=True, help="the checkpoint's step")
    parser.add_argument("--tasks", help="comma-separated lm-eval tasks (default: the run's eval.harness.tasks)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when there is one)")
    parser.add_argument("--where", default="by hand", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Imported only now, so that --help answers at once (torch and the export behind these).
    from resilient_slurm.config import ConfigError
    from resilient_slurm.evaluate.job import evaluate_checkpoint, lower_priority
    from resilient_slurm.rundir.identity import load_config

    if not _lm_eval_installed():
        print("evaluate: lm-eval is not installed; pip install 'resilient-slurm[eval]'", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        cfg = load_config(args.run_dir)
    except (ConfigError, FileNotFoundError) as e:
        print(f"evaluate: {args.run_dir}: {e}; pass a run directory (experiments/<experiment>/<run>)", file=sys.stderr)
        return 2
    tasks = [t for t in (args.tasks or "").split(",") if t] or list(cfg.eval.harness.tasks)
    if not tasks:
        print("evaluate: no tasks; pass --tasks tiny_mmlu,tiny_gsm8k or set eval.harness.tasks", file=sys.stderr)
        return 2
    if args.where == "local":
        lower_priority()
    where = args.where
    if where == "slurm":
        where = f"slurm:{os.environ.get('SLURM_JOB_ID', '?')}"
    # The run starts its evaluations as it asks for the save, so they wait for the commit; by hand, the
    # checkpoint is there or it is not.
    wait = None if args.where in ("local", "slurm") else 0.0
    outcome = evaluate_checkpoint(args.run_dir, cfg, args.step, tasks, where=where, device=args.device,
                                  wait_commit_s=wait)
    if outcome.scores is None:
        print(f"evaluate: step {args.step} of {args.run_dir} failed twice: {outcome.errors[-1]}", file=sys.stderr)
        return 1
    print(f"step {args.step}: " + "  ".join(f"{k} {v:.4g}" for k, v in outcome.scores.items()))
    return 0


def _lm_eval_installed() -> bool:
    try:
        return importlib.util.find_spec("lm_eval") is not None
    except (ImportError, ValueError):  # None in sys.modules, a broken install
        return False


if __name__ == "__main__":
    sys.exit(main())
