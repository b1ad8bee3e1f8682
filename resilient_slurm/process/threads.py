"""How many CPU threads a rank computes with, and how OpenMP waits between parallel regions.

The default divides the CPUs this process may run on (its affinity mask; in a Slurm job at most
SLURM_CPUS_PER_TASK, the task's own share) by the ranks of this node, so ranks never oversubscribe
the cores. OpenMP threads that spin while they wait for work steal the CPU from every other process:
with one other CPU-bound process on the machine a run was 9x slower (a 2-core laptop, 2 threads per
rank). So OpenMP is told to yield (OMP_WAIT_POLICY=PASSIVE) unless the user chose a policy or pinned
its threads (OMP_PROC_BIND), where spinning is what they asked for. It must be in the environment
before torch is imported, since the OpenMP runtime reads it when it loads.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def choose_threads(configured: int, cpus: int, cpus_per_task: int | None, local_ranks: int) -> int:
    """`train.threads` when set; else the task's CPUs in a Slurm job, else this node's CPUs per rank. Pure."""
    if configured > 0:
        return configured
    if cpus_per_task:
        return max(1, min(cpus, cpus_per_task))
    return max(1, cpus // max(local_ranks, 1))


def yield_when_idle(env: MutableMapping[str, str]) -> None:
    """OMP_WAIT_POLICY=PASSIVE in `env`, unless the user chose a policy or pinned the threads."""
    pinned = env.get("OMP_PROC_BIND", "").lower() not in ("", "false")
    if "OMP_WAIT_POLICY" not in env and not pinned:
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def rank_threads(configured: int, local_ranks: int) -> int:
    """This process's thread count (`choose_threads` over the CPUs it may use)."""
    cpus = len(os.sched_getaffinity(0))
    per_task = int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0) or None
    return choose_threads(configured, cpus, per_task, local_ranks)
