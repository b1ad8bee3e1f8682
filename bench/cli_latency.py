"""How soon the commands answer: `launch --help`, a config error, a bare `launch`, and the other
commands' `--help`, against Python's own start-up on this machine (the floor no command can go below).

    python bench/cli_latency.py [--repeats 7]

Each command runs as a user runs it (a fresh interpreter, `python -m resilient_slurm.launch ...`),
in a rotated order so that a change in what else runs on the machine falls on all of them; the
table has each one's median and range, and the targets of issue 21: --help under 1.5 s, a config
error under 2 s. The config errors: a typo (`optim.lrr=1e-3`: the overrides are checked before
Hydra composes), a value of the wrong type and one out of range (composed and validated); none
imports torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "resilient_slurm.launch"]
COMMANDS = {
    "python -c pass": ([sys.executable, "-c", "pass"], 0, None),
    "launch --help": ([*LAUNCH, "--help"], 0, 1.5),
    "launch (bare)": (LAUNCH, 2, 2.0),
    "launch +experiment=tiny_sft optim.lrr=1e-3": ([*LAUNCH, "+experiment=tiny_sft", "optim.lrr=1e-3"], 2, 2.0),
    "launch +experiment=tiny_sft optim.lr=abc": ([*LAUNCH, "+experiment=tiny_sft", "optim.lr=abc"], 2, 2.0),
    "launch +experiment=tiny_sft train.max_steps=0": ([*LAUNCH, "+experiment=tiny_sft", "train.max_steps=0"], 2, 2.0),
    # Issue 27, item 13: export --help took 6 s (torch imported before the arguments were read).
    "export --help": ([sys.executable, "-m", "resilient_slurm.export", "--help"], 0, 1.5),
    "evaluate --help": ([sys.executable, "-m", "resilient_slurm.evaluate", "--help"], 0, 1.5),
    "data --help": ([sys.executable, "-m", "resilient_slurm.data", "--help"], 0, 1.5),
    "sweep --help": ([sys.executable, "-m", "resilient_slurm.sweep", "--help"], 0, 1.5),
}


def timed(argv: list[str], expected: int) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"cli_latency: {' '.join(argv)} exited {done.returncode}, not {expected}:\n{done.stderr}")
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    names = list(COMMANDS)
    times: dict[str, list[float]] = {n: [] for n in names}
    load = os.getloadavg()[0]
    for i in range(args.repeats):
        for name in names[i % len(names):] + names[: i % len(names)]:
            argv_, expected, _ = COMMANDS[name]
            times[name].append(timed(argv_, expected))
    print(f"launch latency, {args.repeats} runs each, rotated; {os.cpu_count()} CPUs, load average "
          f"{load:.2f} -> {os.getloadavg()[0]:.2f}")
    print("| command | median s | min-max s | target |")
    print("|---|---|---|---|")
    for name in names:
        t, target = times[name], COMMANDS[name][2]
        verdict = "" if target is None else f"< {target} s: {'met' if statistics.median(t) < target else 'NOT met'}"
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f}-{max(t):.2f} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
