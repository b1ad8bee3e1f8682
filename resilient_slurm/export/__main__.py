"""`python -m resilient_slurm.export RUN_DIR OUT [--step N] [--dtype bfloat16|float32]`: a checkpoint of
a run as a Hugging Face model directory that transformers and vLLM load (the newest valid one
unless --step). Exit status: 0 written, 1 the checkpoint or the export failed, 2 usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.checkpointer import hot_root
from resilient_slurm.config import ConfigError
from resilient_slurm.export.from_checkpoint import DTYPES, export_checkpoint
from resilient_slurm.export.hf_writer import ExportError
from resilient_slurm.launch.rundir import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("out", type=Path, metavar="OUT")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest that verifies)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.run_dir)
        root = hot_root(args.run_dir, cfg.checkpoint)
        steps = [(s, p) for s, p in store.list_step_dirs(root) if (p / layout.MANIFEST).is_file()]
        if args.step is not None:
            steps = [(s, p) for s, p in steps if s == args.step]
        if not steps:
            what = f"step {args.step}" if args.step is not None else "committed checkpoint"
            print(f"export: no {what} in {root}; list them with ls {root}", file=sys.stderr)
            return 1
        errors = []
        for step, path in steps:  # newest first
            try:
                export_checkpoint(path, args.out, cfg, DTYPES[args.dtype], cfg.checkpoint.io_threads)
            except ExportError as e:
                errors.append(str(e))
                if args.step is not None or "not a valid checkpoint" not in str(e):
                    break
                continue
            print(f"exported step {step} of {args.run_dir} to {args.out} ({args.dtype})")
            return 0
        print(errors[-1], file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"export: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
