"""Several "nodes" on one machine: the ranks of a prepared run as separate processes, each told the
name of the node it runs on (RankInfo.node), which node-local tiers (the memory tier with `%n` in
its dir, a node-local hot tier) key their files by. Everything else is what a job runs
(`runtime.rank.run`); only the node names are not Slurm's.

    python -m tests.integration.nodes RUN_DIR NODE     one rank (RANK, WORLD_SIZE, MASTER_PORT set)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from resilient_slurm.config import register_schema, to_config
from resilient_slurm.launch.prepare import prepare as prepare_run_dir
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.ledger import Event, read_events
from tests.integration.runs import REPO, SMALL
from tests.ports import free_port


def prepare(root: Path, name: str, *overrides: str) -> Path:
    """The run directory `launch` would make for SMALL plus `overrides`, without running it."""
    register_schema()
    args = [*SMALL, f"run.root={root}", f"run.name={name}", *overrides]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = to_config(compose("config", overrides=args))
    return prepare_run_dir(cfg, args)[0]


def start(run_dir: Path, nodes: tuple[str, ...]) -> list[subprocess.Popen]:
    """Rank r of the run on node `nodes[r]`, each in its own process."""
    port = free_port()
    procs = []
    for rank, node in enumerate(nodes):
        # LOCAL_WORLD_SIZE: the ranks sharing this machine's cores (torch threads per rank).
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE=str(len(nodes)),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.integration.nodes", str(run_dir), node], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def wait_for(procs: list[subprocess.Popen], run_dir: Path, found: Callable[[list[Event[Any]]], bool],
             timeout: float = 180) -> list[Event[Any]]:
    """Until the ledger satisfies `found`; fails if a rank exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = read_events(run_dir / "events.jsonl")
        if found(events):
            return events
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a rank exited with {p.returncode} first:\n{p.stdout.read() if p.stdout else ''}")
        time.sleep(0.02)
    raise AssertionError(f"not found in the ledger within {timeout} s")


def kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.communicate(timeout=60)


def finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    """Each rank's exit status and output, once all have exited."""
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def main(argv: list[str]) -> int:
    from resilient_slurm.session.distributed import RankInfo
    from resilient_slurm.runtime.rank import run

    run_dir, node = Path(argv[0]), argv[1]
    base = RankInfo.from_env()
    info = RankInfo(base.rank, base.world_size, base.local_rank, base.master_addr, base.master_port, node)
    return int(run(load_config(run_dir), run_dir, info).code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
