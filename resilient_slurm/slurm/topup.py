"""Spare nodes a running job asks Slurm for (cluster.spare_topup): a job of their own that only holds
them, so that the driver can start a lost replica group's ranks there (`srun --jobid`). Slurm cannot
grow a running job's allocation; a second job next to it can hold nodes for it, and a replica group
is the one thing that can run across the two, since a group's ranks meet over the network, not
inside one job step.

`wanted`, `script` and `answer` are pure; `ask`, `look` and `give_back` run sbatch, scontrol and
scancel, and never raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from resilient_slurm.slurm import scontrol
from resilient_slurm.slurm.env import expand_hostlist
from resilient_slurm.slurm.sbatch import sbatch

if TYPE_CHECKING:  # the package imports nothing beyond the standard library (see its map)
    from resilient_slurm.config import ClusterConfig


@dataclass(frozen=True)
class TopUp:
    job_id: str
    nodes: tuple[str, ...] = ()
    """Its nodes once it runs; empty while it waits in the queue."""
    gone: bool = False
    """It ended, or Slurm refused or forgot it: it will hold no node."""


def wanted(usable: int, at: int, waiting: bool, refused: bool) -> bool:
    """Whether to ask for a top-up now: `at` usable spares or fewer left (cluster.spare_topup_at),
    none on its way, and Slurm did not refuse one since the groups started (one refusal is one line,
    not one a second). Pure."""
    return usable <= at and not waiting and not refused


def script(c: ClusterConfig, count: int, name: str, exclude: tuple[str, ...], minutes: int, output: Path) -> str:
    """The batch script of a job that holds `count` nodes, as the run's own job asks for each of its
    nodes (tasks, CPUs, GPUs, memory, partition, account, QOS, constraint), never one of `exclude`
    (the run's own nodes), for `minutes`. Its batch step only sleeps; the driver's steps use its
    nodes. Pure."""
    options = [f"--job-name={name}", f"--nodes={count}", f"--ntasks-per-node={c.tasks_per_node}",
               f"--time={max(1, minutes)}", f"--output={output}", "--no-requeue"]
    if exclude:
        options.append(f"--exclude={','.join(exclude)}")
    optional = {"partition": c.partition, "account": c.account, "qos": c.qos, "constraint": c.constraint,
                "cpus-per-task": c.cpus_per_task, "gpus-per-node": c.gpus_per_node or None,
                "mem": f"{int(c.mem_gb * 1024)}M" if c.mem_gb else None}
    options += [f"--{k}={v}" for k, v in optional.items() if v is not None]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in options), "exec sleep 2147483647", ""])


def answer(job_id: str, shown: str) -> TopUp:
    """What `scontrol show job --oneliner JOB` says of a top-up job. Pure."""
    state = re.search(r"\bJobState=(\S+)", shown)
    if state is None:
        return TopUp(job_id)
    if state.group(1) == "RUNNING":
        nodes = re.search(r"\bNodeList=(\S+)", shown)
        return TopUp(job_id, tuple(expand_hostlist(nodes.group(1))) if nodes else ())
    return TopUp(job_id, gone=state.group(1) not in ("PENDING", "CONFIGURING", "REQUEUED"))


def minutes_left(job_id: str) -> int | None:
    """Whole minutes until the job's time limit, from Slurm (None: it did not say)."""
    ok, out = scontrol.scontrol("show", "job", "--oneliner", job_id)
    limit, run = re.search(r"\bTimeLimit=(\S+)", out), re.search(r"\bRunTime=(\S+)", out)
    if not ok or limit is None or run is None:
        return None
    left = _seconds(limit.group(1)) - _seconds(run.group(1))
    return max(1, int(left // 60)) if left > 0 else None


def ask(c: ClusterConfig, job_id: str, exclude: tuple[str, ...], output: Path) -> tuple[TopUp | None, str]:
    """Submit a top-up job for the run's job `job_id`; (it, "") or (None, why not in one line)."""
    minutes = minutes_left(job_id) or c.time_min
    ok, said = sbatch(script(c, c.spare_topup, f"spares-for-{job_id}", exclude, minutes, output))
    return (TopUp(said), "") if ok else (None, said)


def look(top: TopUp) -> TopUp:
    """The job as Slurm sees it now (unchanged when scontrol cannot answer)."""
    ok, out = scontrol.scontrol("show", "job", "--oneliner", top.job_id)
    if not ok:
        return TopUp(top.job_id, gone=True) if "Invalid job id" in out else top
    return answer(top.job_id, out)


def give_back(top: TopUp) -> None:
    """Cancel the job: its nodes go back to the cluster."""
    scontrol.cancel(top.job_id)


def _seconds(spelled: str) -> float:
    """Slurm's `[days-]hours:minutes:seconds` (or `minutes:seconds`); UNLIMITED is taken as a year."""
    if spelled in ("UNLIMITED", "INFINITE"):
        return 365 * 86400.0
    days, _, clock = spelled.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400.0 + parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
