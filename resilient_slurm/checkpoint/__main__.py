"""`python -m resilient_slurm.checkpoint verify PATH [PATH ...]`

Prints one line per checkpoint. Exit status: 0 all valid, 1 some invalid, 2 usage error (a path
that is not a checkpoint at all; a run directory given instead of a checkpoint: its checkpoints
are listed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.rundir import RunDir

EXIT_INVALID = 1
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.checkpoint")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check a checkpoint directory: marker, manifest, sizes, headers, checksums")
    v.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    v.add_argument("--no-checksums", action="store_true", help="skip reading every byte (structure and sizes only)")
    args = parser.parse_args(argv)
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
