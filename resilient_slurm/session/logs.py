"""Each rank's log: `logs/rank-N.log` in the run directory, and rank 0's lines on stdout too, except
those logged with `extra=LOG_ONLY` (details a user needs only when something went wrong: the thread
count, why GPU metrics are off, a survivor's traceback after a peer died)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from resilient_slurm.console import LOG_ONLY, on_console
from resilient_slurm.rundir import RunDir

__all__ = ["LOG_ONLY", "setup_logging"]

log = logging.getLogger("resilient_slurm")


def setup_logging(run_dir: Path, rank: int) -> None:
    logs = RunDir(run_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s [rank %(rank)s] %(message)s", "%H:%M:%S")
    handlers: list[logging.Handler] = [logging.FileHandler(logs / f"rank-{rank}.log")]
    if rank == 0:
        console = logging.StreamHandler(sys.stdout)
        console.addFilter(on_console)
        handlers.append(console)
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(_RankFilter(rank))
        log.addHandler(h)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True
