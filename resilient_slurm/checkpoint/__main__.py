"""`python -m resilient_slurm.checkpoint verify PATH [PATH ...]` and
`python -m resilient_slurm.checkpoint convert SRC DST --to dcp|native`

verify prints one line per checkpoint. Exit status: 0 all valid, 1 some invalid, 2 usage error (a
path that is not a checkpoint at all; a run directory given instead of a checkpoint: its
checkpoints are listed).

convert turns a checkpoint of ours (a step directory, or a run directory's newest valid one) into a
torch.distributed.checkpoint directory (`--to dcp`), or a DCP directory into a checkpoint of ours
(`--to native`); model weights only. Exit status 2 with one line for anything it cannot do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.names import NAMINGS
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.errors import InputError
from resilient_slurm.rundir import RunDir

if TYPE_CHECKING:
    from resilient_slurm.checkpoint.convert import Heads

EXIT_INVALID = 1
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.checkpoint")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check a checkpoint directory: marker, manifest, sizes, headers, checksums")
    v.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    v.add_argument("--no-checksums", action="store_true", help="skip reading every byte (structure and sizes only)")
    c = sub.add_parser(
        "convert", help="a checkpoint to torch.distributed.checkpoint's format (DCP) or back; model weights only",
        description="Convert model weights between a checkpoint of ours and a torch.distributed.checkpoint (DCP) "
                    "directory, chunk by chunk, without a process group. --to dcp: SRC is a checkpoint (step "
                    "directory) or a run directory (its newest valid checkpoint), DST a new DCP directory that "
                    "dcp.load reads at any sharding. --to native: SRC is a DCP directory (one with .metadata), DST a "
                    "new checkpoint directory (step 0 unless it is named step_N) that resumes, exports and loads at "
                    "any layout. Optimizer state, RNG states and data positions are not converted.")
    c.add_argument("src", type=Path, metavar="SRC")
    c.add_argument("dst", type=Path, metavar="DST")
    c.add_argument("--to", required=True, choices=("dcp", "native"), help="the format to write")
    c.add_argument("--names", choices=NAMINGS, default=None,
                   help="tensor names in the DCP directory: hf (ours, Hugging Face's; the default for --to dcp) or "
                        "torchtitan (Llama-3: tok_embeddings, layers.N.attention.wq, ..., with wq/wk rows permuted "
                        "for its rotary layout); --to native recognises either by itself")
    c.add_argument("--heads", type=int, default=None, help="attention heads (torchtitan names: permuting wq needs it; "
                   "default: the run's model.num_heads when SRC is in a run)")
    c.add_argument("--kv-heads", type=int, default=None, help="key/value heads (for wk; default: the run's)")
    c.add_argument("--prefix", default=None,
                   help="--to native: the model's tensors are the DCP keys under this prefix (e.g. 'model.' when a "
                        "loop saved {'model': state_dict, ...}; '' for all); default: a Llama's, found by its "
                        "embedding's name")
    c.add_argument("--max-shard-bytes", type=int, default=1 << 30, help="--to native: files of at most this size")
    c.add_argument("--io-threads", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "convert":
        return _convert(args)
    status = 0
    for path in args.paths:
        if RunDir(path).exists():
            steps = store.list_step_dirs(RunDir(path).checkpoints)
            print(f"not a checkpoint: {path}: a run directory; verify one of its checkpoints"
                  + (" (newest first):" if steps else ": it has none yet"))
            for _, step_dir in steps:
                print(f"  {step_dir}")
            status = max(status, EXIT_USAGE)
            continue
        if (what := _not_a_checkpoint(path)) is not None:
            print(f"not a checkpoint: {path}: {what}; give a checkpoint directory (a run's "
                  f"checkpoints/step_NNNNNNNN), or the run directory to list them")
            status = max(status, EXIT_USAGE)
            continue
        verdict = verify(path, checksums=not args.no_checksums)
        if verdict.ok and verdict.manifest is not None:
            m = verdict.manifest
            total = sum(e.nbytes for e in m.files.values())
            print(f"ok: {path}: step {m.step}, {len(m.files)} files, {total / 1e6:.1f} MB")
        else:
            print(f"invalid: {path}: {verdict.reason}")
            status = max(status, EXIT_INVALID)
    return status


def _convert(args: argparse.Namespace) -> int:
    from resilient_slurm.checkpoint import convert

    try:
        heads = _heads(args)
        if args.to == "dcp":
            done = convert.to_dcp(args.src, args.dst, args.names or "hf", heads, args.io_threads)
        else:
            done = convert.to_native(args.src, args.dst, args.names, heads, args.max_shard_bytes, args.io_threads,
                                     args.prefix)
    except InputError as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    left = f"; {done.skipped} tensors of other state left behind" if done.skipped else ""
    print(f"converted {done.source} -> {args.dst} ({args.to}): {done.tensors} tensors in {done.chunks} chunks, "
          f"{done.nbytes / 1e6:.1f} MB{left}")
    return 0


def _heads(args: argparse.Namespace) -> Heads | None:
    """Head counts from the flags, else from the config of the run SRC is in (a checkpoint of ours)."""
    from resilient_slurm.checkpoint.convert import Heads
    from resilient_slurm.rundir.identity import load_config

    if args.heads is not None:
        return Heads(args.heads, args.kv_heads or args.heads)
    for run in (args.src, args.src.parent.parent):
        if args.to == "dcp" and RunDir(run).exists() and RunDir(run).config.exists():
            model = load_config(run).model
            return Heads(model.num_heads, model.num_kv_heads)
    return None


def _not_a_checkpoint(path: Path) -> str | None:
    """What `path` is instead of a checkpoint: nothing there, a file, or a directory with neither a
    commit marker nor a checkpoint's name or files. A step directory without its marker is a
    checkpoint whose save did not finish: `verify` says so."""
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "a file, not a directory"
    if (path / layout.MANIFEST).exists() or layout.parse_step_dir(path.name) is not None \
            or any(path.glob("model*.safetensors")):
        return None
    return f"no {layout.MANIFEST} and no model*.safetensors in it"


if __name__ == "__main__":
    sys.exit(main())
