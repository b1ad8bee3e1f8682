"""`python -m resilient_slurm.export RUN_DIR OUT [--step N] [--dtype bfloat16|float16|float32] [--merge]`:
a checkpoint of a run as a Hugging Face model directory that transformers and vLLM load (the newest
valid one unless --step); for a LoRA run a PEFT adapter directory, or with --merge the base model
with the adapters merged in. Streaming: memory stays within one output shard of at most 5 GB.

Exit status: 0 written, 1 the checkpoint or the export failed, 2 usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("bfloat16", "float16", "float32")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="the run's directory (experiments/<experiment>/<run>)")
    parser.add_argument("out", type=Path, metavar="OUT", help="the model directory to write")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest that verifies)")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="of the weights written (default: bfloat16 for a model, float32 for an adapter)")
    parser.add_argument("--merge", action="store_true",
                        help="LoRA runs: the base model with the adapters merged in, instead of the adapter")
    args = parser.parse_args(argv)
    # Imported only now, so that --help answers at once (torch is behind these).
    from resilient_slurm.checkpoint import layout, store
    from resilient_slurm.checkpoint.checkpointer import hot_root
    from resilient_slurm.config import ConfigError
    from resilient_slurm.export.from_checkpoint import DTYPES as TORCH_DTYPES
    from resilient_slurm.export.from_checkpoint import export_checkpoint
    from resilient_slurm.export.hf_writer import ExportError
    from resilient_slurm.rundir.identity import load_config

    try:
        cfg = load_config(args.run_dir)
        if args.merge and cfg.model.lora.rank is None:
            print(f"export: {args.run_dir} is a full fine-tune, with no adapters to merge; export it without --merge",
                  file=sys.stderr)
            return 2
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
                written = export_checkpoint(path, args.out, cfg, TORCH_DTYPES[args.dtype] if args.dtype else None,
                                            cfg.checkpoint.io_threads, merge=args.merge)
            except ExportError as e:
                errors.append(str(e))
                if args.step is not None or "not a valid checkpoint" not in str(e):
                    break
                continue
            what = {"peft": ", a PEFT LoRA adapter", "hf": ", adapters merged" if args.merge else ""}[written.format]
            print(f"exported step {step} of {args.run_dir} to {args.out} ({written.dtype}{what})")
            return 0
        print(errors[-1], file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"export: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
