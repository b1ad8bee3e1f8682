"""`sweep.controller=slurm`: the controller as a small Slurm job of its own (one task, one CPU),
submitted through submitit. It runs the same command inside the job; at the time-limit warning it
stops its loop, requeues itself and, on the next start, resumes the study like any restarted
controller. Its trials are Slurm jobs of their own, so they run on meanwhile.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.slurm import scontrol
from resilient_slurm.sweep.cli import Plan, SweepError

JOB_FILE = "controller/job_id"


class ControllerTask:
    """Picklable: the command line and the directory it was given in."""

    def __init__(self, argv: list[str], cwd: str) -> None:
        self.argv, self.cwd = argv, cwd

    def __call__(self) -> str:
        from resilient_slurm.process.signals import install_stop_handlers

        stop = install_stop_handlers()
        from resilient_slurm.sweep import cli, session

        os.chdir(self.cwd)
        job_id = os.environ["SLURM_JOB_ID"]
        # The trials' jobs are submitted from inside this one: they must not inherit its allocation.
        for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            os.environ.pop(key)
        plan = cli.parse([*self.argv, "sweep.controller=here"])
        if plan is None:
            sys.exit(int(ExitCode.CONFIG))
        code = session.run(plan, stop)
        if code == ExitCode.DONE:
            return f"sweep done: {plan.path()}"
        if stop.signal_name in ("SIGUSR1", "SIGUSR2"):  # the time-limit warning, not a cancel
            ok, message = scontrol.requeue(job_id)
            print(f"resilient_slurm: sweep controller requeued itself: {ok} {message.strip()}", flush=True)
        sys.exit(int(code))


def submit_controller(plan: Plan, argv: list[str]) -> str:
    """Submit the controller job unless the study already has one that is alive; its job id."""
    import submitit

    cfg, path = plan.cfg, plan.path()
    marker = path / JOB_FILE
    if marker.exists():
        previous = marker.read_text().strip()
        ok, state = scontrol.job_state(previous)
        if not ok or state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE",
                                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"):
            raise SweepError(f"sweep {path} already has a controller job {previous} ({state}); wait for it or "
                             f"scancel it")
    c = cfg.cluster
    lead = min(c.signal_lead_s, cfg.sweep.controller_time_min * 30)
    executor = submitit.SlurmExecutor(folder=path / "controller", max_num_timeout=0)
    params = {"job_name": f"sweep-{plan.name()}", "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 1,
              "time": cfg.sweep.controller_time_min, "signal_delay_s": lead,
              "additional_parameters": {"signal": f"{c.signal}@{lead}", "requeue": True}}
    optional = {"partition": c.partition, "account": c.account, "qos": c.qos, "setup": c.setup or None}
    executor.update_parameters(**params, **{k: v for k, v in optional.items() if v is not None})
    job = executor.submit(ControllerTask([*argv, f"sweep.name={plan.name()}"], str(Path.cwd())))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{job.job_id}\n")
    print(f"resilient_slurm: submitted controller job {job.job_id} for sweep {path}")
    print(f"  follow:  tail -F {path / 'controller' / f'{job.job_id}_0_log.out'}")
    return job.job_id
