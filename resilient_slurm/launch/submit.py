"""`cluster=slurm`: submit the run as a Slurm job through submitit, and say where to watch it.

Each task of the job runs `supervise.task.SlurmTask`; with spare nodes or elastic shrinking, the batch
script runs `supervise.driver.SlurmDriver`, which starts the tasks as job steps itself."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

from resilient_slurm.rundir import RunDir
from resilient_slurm import config
from resilient_slurm.config import ClusterConfig, Config
from resilient_slurm.health import exclude_list, node_record
from resilient_slurm.ledger import EventLog, Submitted
from resilient_slurm.supervise.driver import SlurmDriver
from resilient_slurm.supervise.task import SlurmTask


def executor_parameters(c: ClusterConfig, job_name: str, exclude: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for a cluster config. Pure.

    A driven job (spare nodes, or elastic.min_nodes) allocates its spares too and runs the driver
    in the batch script itself (no srun: the driver starts the job steps), with `--no-kill`, so
    that a node that fails leaves the allocation instead of ending the job."""
    driven = config.driven(c)
    extra: dict[str, Any] = {"signal": f"{c.signal}@{c.signal_lead_s}", "requeue": True}
    if driven:
        extra["no-kill"] = True
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": c.nodes + c.spare_nodes if driven else c.nodes,
        "ntasks_per_node": c.tasks_per_node,
        "time": c.time_min,
        "signal_delay_s": c.signal_lead_s,
        # Our signal, not submitit's fixed one; requeue explicitly, whatever the cluster's default.
        "additional_parameters": {**extra, **c.sbatch_extra},
    }
    if driven:
        params["use_srun"] = False
    optional = {
        "partition": c.partition, "gpus_per_node": c.gpus_per_node or None, "cpus_per_task": c.cpus_per_task,
        "mem": f"{int(c.mem_gb * 1024)}M" if c.mem_gb else None, "account": c.account, "qos": c.qos,
        "constraint": c.constraint, "exclude": exclude or None, "setup": c.setup or None,
        "srun_args": None if driven else c.srun_extra or None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def exclude_value(cfg: Config, now: float) -> str:
    """The new job's --exclude: the exclude list's active nodes, and those the cluster's node record
    keeps out (health.node_record_policy)."""
    nodes: set[str] = set()
    if cfg.cluster.exclude_file:
        nodes |= {e.node for e in exclude_list.active(exclude_list.load(cfg.cluster.exclude_file), now)}
    h = cfg.health
    if h.node_record:
        p = h.node_record_policy
        nodes |= set(node_record.excluded_now(h.node_record, p.window_h * 3600.0, p.limits(), now))
    return ",".join(sorted(nodes))


class SubmitError(RuntimeError):
    """sbatch refused the job, or there is no Slurm here; one line saying which and the fix."""


def submit(cfg: Config, run_dir: Path) -> str:
    """Submit; returns the job id. With `cluster.wait`, also blocks until the job ends."""
    import submitit

    excluded = exclude_value(cfg, time.time())
    executor = submitit.SlurmExecutor(folder=RunDir(run_dir).slurm, max_num_timeout=0)
    executor.update_parameters(**executor_parameters(cfg.cluster, run_dir.name, excluded))
    task = (SlurmDriver if config.driven(cfg.cluster) else SlurmTask)(str(run_dir))
    try:
        # submitit prints sbatch's whole stderr before raising; the one line below says it.
        with contextlib.redirect_stderr(io.StringIO()):
            job = executor.submit(task)
    except (submitit.core.utils.FailedJobError, OSError) as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if "fatal" in line or "error" in line), lines[-1] if lines else "")
        raise SubmitError(f"cluster=slurm: sbatch refused the job: {said.strip() or type(e).__name__}; check that "
                          f"Slurm is configured here (sinfo), or use cluster=local") from None
    EventLog(RunDir(run_dir).events, rank=-1, context={"job_id": job.job_id}).emit(
        Submitted(exclude=excluded or None), None)
    log = RunDir(run_dir).slurm / f"{job.job_id}_0_log.out"
    print(f"resilient_slurm: submitted job {job.job_id} for run {run_dir}")
    print(f"  follow:  tail -F {log}")
    print(f"  ledger:  {run_dir / 'events.jsonl'}")
    if cfg.cluster.wait:
        print(f"  result:  {job.result()}")
    return job.job_id
