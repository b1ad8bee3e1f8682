"""The job a driver runs in: its ids, config and run directory, the ledger context the driver writes
under, and the srun command line of a start (or of one replacement or standby task)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilient_slurm.ledger import EventLog
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.rundir import RunDir
from resilient_slurm.slurm import srun

if TYPE_CHECKING:
    from resilient_slurm.config import Config


@dataclass(frozen=True)
class DriverJob:
    path: Path
    cfg: Config
    job_id: str
    restart: int
    """SLURM_RESTART_COUNT of this allocation."""
    node: str
    """The node the driver runs on."""
    launch: RankLaunch
    """What every task the driver starts is told (heartbeat address, driven, rejoin)."""

    def log(self, step_id: int | None, rank: int = -1, node: str | None = None) -> EventLog:
        """The driver writes under the step's attempt key; a lost task's failure under its own rank and node."""
        return EventLog(RunDir(self.path).events, rank=rank, context=self.context(step_id, node))

    def context(self, step_id: int | None, node: str | None = None) -> dict[str, Any]:
        return {"job_id": self.job_id, "restart": self.restart, "job_step": step_id or 0, "node": node or self.node}

    def argv(self, nodes: tuple[str, ...], tasks_per_node: int, launch: RankLaunch | None = None,
             overlap: bool = False, job_id: str | None = None) -> list[str]:
        """srun for a start on `nodes` (or one task of a replacement or a standby, told `launch`;
        `overlap`: beside the survivors' step, on their node; `job_id`: in the job that lends the
        run these nodes, a spare top-up)."""
        c = self.cfg.cluster
        return srun.step_argv(nodes, tasks_per_node,
                              [sys.executable, "-u", "-m", "resilient_slurm.supervise.task", str(self.path)],
                              cpus_per_task=c.cpus_per_task, gpus_per_node=c.gpus_per_node, extra=c.srun_extra,
                              survivors_stay=self.launch.rejoin, env=(launch or self.launch).exports(),
                              overlap=overlap, job_id=job_id)


def say(message: str) -> None:
    print(f"resilient_slurm driver: {message}", file=sys.stderr, flush=True)
