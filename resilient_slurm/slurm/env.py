"""What a task of a Slurm job learns from its environment: job, rank, node list, the rendezvous
port. Pure and standard library only (hostlist and tasks-per-node parsing included)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SlurmEnv:
    """What a task of a running Slurm job knows about itself, from its environment."""

    job_id: str
    restart_count: int
    """SLURM_RESTART_COUNT: 0 on the first run, n after the n-th requeue."""
    step_id: int
    """SLURM_STEP_ID: the job step the task runs in. A restart inside the allocation starts a new
    step, so (job id, restart count, step) names one start of the run."""
    procid: int
    ntasks: int
    localid: int
    local_ntasks: int
    nodename: str
    nodes: tuple[str, ...]
    """The nodes of the task's job step, in rank order."""
    cpus_per_task: int | None

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> SlurmEnv | None:
        """None outside a Slurm task (no SLURM_JOB_ID or no SLURM_PROCID)."""
        e = os.environ if env is None else env
        if "SLURM_JOB_ID" not in e or "SLURM_PROCID" not in e:
            return None
        # The step's own nodes: a driver's step runs on part of the job's allocation.
        nodelist = e.get("SLURM_STEP_NODELIST") or e.get("SLURM_JOB_NODELIST") or e.get("SLURMD_NODENAME", "")
        nodes = tuple(expand_hostlist(nodelist))
        nodename = e.get("SLURMD_NODENAME", nodes[0] if nodes else "")
        counts = tasks_per_node(e.get("SLURM_STEP_TASKS_PER_NODE", e.get("SLURM_TASKS_PER_NODE", "1")))
        index = nodes.index(nodename) if nodename in nodes else 0
        cpus = e.get("SLURM_CPUS_PER_TASK")
        return SlurmEnv(
            job_id=e["SLURM_JOB_ID"],
            restart_count=int(e.get("SLURM_RESTART_COUNT", "0") or 0),
            step_id=_int_or_zero(e.get("SLURM_STEP_ID", e.get("SLURM_STEPID", "0"))),
            procid=int(e["SLURM_PROCID"]),
            ntasks=int(e.get("SLURM_NTASKS", e.get("SLURM_NPROCS", "1"))),
            localid=int(e.get("SLURM_LOCALID", "0")),
            local_ntasks=counts[index] if index < len(counts) else counts[-1],
            nodename=nodename,
            nodes=nodes,
            cpus_per_task=int(cpus) if cpus else None,
        )

    def context(self) -> dict[str, Any]:
        """Fields stamped on every event of this task."""
        return {"job_id": self.job_id, "restart": self.restart_count, "job_step": self.step_id, "node": self.nodename}

    @property
    def attempt(self) -> tuple[str, int, int]:
        """(job id, restart count, step): one start of the run, as `recovery.attempt_key` spells it."""
        return self.job_id, self.restart_count, self.step_id


def expand_hostlist(hostlist: str) -> list[str]:
    """`n[1-3,7],gpu[08-09],login` -> `[n1, n2, n3, n7, gpu08, gpu09, login]`. Pure."""
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{n:0{width}d}{suffix}")
    return out


def tasks_per_node(spec: str) -> list[int]:
    """`2(x3),1` -> `[2, 2, 2, 1]` (the format of SLURM_TASKS_PER_NODE). Pure."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            out += [int(m.group(1))] * int(m.group(2) or 1)
    return out or [1]


def master_port(job_id: str, step_id: int) -> int:
    """A rendezvous port every task of one job step derives alike: different for concurrent jobs, and
    for a new step of the same job (a restart inside the allocation must not meet the old store)."""
    return 29500 + (int(re.sub(r"\D", "", job_id) or 0) * 31 + step_id) % 10000


def _int_or_zero(text: str) -> int:
    """The batch script's own step is spelled `batch` (or `extern`), not a number."""
    return int(text) if text.isdigit() else 0
