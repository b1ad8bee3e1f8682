"""The memory tier's directories on a node: where they are, how much room the node has for them,
and who deletes them.

Each run's tier is `<checkpoint.memory.dir>/<experiment>/<run>/` on every node it runs on, with a
claim file (`.resilient_slurm_memory`: the run and the Slurm job that made it). tmpfs keeps the
files after the training processes end, until the node reboots, so something must delete them:

- the run itself, when it finishes (`Checkpointer.close(finished=True)`);
- otherwise (a job cancelled, failed, or requeued onto other nodes) the Slurm epilog, or the job's
  driver when it gives up its nodes: `python -m resilient_slurm.checkpoint.memory_files clean DIR
  [--job-id ID]`, which removes only directories with a claim file (of that job, with --job-id).

This module imports the standard library only: the epilog runs it in a bare environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
from pathlib import Path

CLAIM = ".resilient_slurm_memory"
NODE_TOKEN = "%n"


def root(run_dir: Path, memory_dir: str, node: str) -> Path:
    """A run's tier on `node`."""
    return Path(memory_dir.replace(NODE_TOKEN, node)) / run_dir.parent.name / run_dir.name


def claim(tier: Path, run_dir: Path) -> None:
    """Create the tier's directory with its claim file (idempotent: a restart keeps the first one's)."""
    tier.mkdir(parents=True, exist_ok=True)
    path = tier / CLAIM
    if not path.exists():
        body = {"run_dir": str(run_dir), "job_id": os.environ.get("SLURM_JOB_ID")}
        tmp = path.with_name(f"{CLAIM}.{os.getpid()}")
        tmp.write_text(json.dumps(body) + "\n")
        os.replace(tmp, path)


def held_bytes(tier: Path) -> int:
    """Bytes of the files the tier holds now (a restarted run reuses this room)."""
    total = 0
    for dirpath, _, names in os.walk(tier):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on `path`'s filesystem (its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """The kernel's estimate of memory available without swapping (MemAvailable), in bytes."""
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo} has no MemAvailable line")


def clean(memory_dir: str, node: str | None = None, job_id: str | None = None) -> list[Path]:
    """Remove every run's tier under `memory_dir` (`%n`: this node) that has a claim file, of job
    `job_id` only when given; the directories removed."""
    base = Path(memory_dir.replace(NODE_TOKEN, node or socket.gethostname()))
    removed = []
    for path in sorted(base.glob(f"*/*/{CLAIM}")):
        tier = path.parent
        if job_id is not None:
            try:
                if str(json.loads(path.read_text()).get("job_id")) != str(job_id):
                    continue
            except (OSError, ValueError):
                continue
        shutil.rmtree(tier, ignore_errors=True)
        removed.append(tier)
    return removed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.checkpoint.memory_files",
                                     description="Remove the memory tier's files of finished jobs (a Slurm epilog).")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clean", help="remove the runs' tiers under DIR (checkpoint.memory.dir)")
    c.add_argument("dir", help="checkpoint.memory.dir; %%n is this node's name")
    c.add_argument("--job-id", default=None, help="only the tiers this Slurm job made (default: every run's)")
    args = parser.parse_args(argv)
    for tier in clean(args.dir, job_id=args.job_id):
        print(f"removed {tier}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
