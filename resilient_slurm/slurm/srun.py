"""The job steps a driver runs: the srun command line, and what srun says about the step. Pure.

srun reports each task that ends badly on its stderr, in the order it learns of them:
`srun: error: n2: task 1: Killed`, `srun: error: n1: tasks 0-1: Exited with exit code 1`, and
`srun: error: Node failure on n2` when a node stops answering. With `--kill-on-bad-exit` the first
of these ends the step, and every report after it is a consequence, so the first ones name the
origin. `-v` makes srun name the step it created (`srun: launching StepId=71.1 on host n2 ...`),
which the driver needs to kill exactly that step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_TASKS = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)")
_STEP = re.compile(r"^srun: launching StepId=(\d+)\.(\d+)")


@dataclass(frozen=True)
class TaskReport:
    """srun's word on tasks that ended badly on one node (or on a node that failed)."""

    node: str
    tasks: tuple[int, ...]
    """Task ids (= ranks); empty for a node failure: every task of the node."""
    status: str
    """`Killed`, `Exited with exit code 1`, `Segmentation fault`, `node failure`, ..."""

    @property
    def exited(self) -> bool:
        """The task ended on its own with a status (a crash it reported), rather than by a signal
        or with its node."""
        return self.status.startswith("Exited with exit code")


def step_argv(nodes: Sequence[str], tasks_per_node: int, command: Sequence[str], *,
              cpus_per_task: int | None = None, gpus_per_node: int = 0, extra: Sequence[str] = (),
              survivors_stay: bool = False, env: Sequence[str] = (), overlap: bool = False,
              job_id: str | None = None) -> list[str]:
    """srun for a step of exactly these nodes. `--kill-on-bad-exit` ends the step when one task
    ends badly, so no rank is left behind waiting in a collective; `survivors_stay` leaves the
    other tasks running instead (the driver restarts them in their processes, or ends the step
    itself). `env`: NAME=VALUE for the tasks besides the driver's environment (what the driver
    tells them: `RankLaunch.exports()`). `overlap`: the step shares the CPUs and GPUs other steps
    hold (`--overlap`): a rank started anew in its dead predecessor's place, on a node whose
    survivors' step still holds them all; without it srun waits for them ("Requested nodes are
    busy"). `job_id`: a step of that job instead of the caller's own (the nodes a spare top-up job
    holds for the run, cluster.spare_topup). Options the step does not inherit from the job (Slurm 22.05 no longer passes
    --cpus-per-task on) are given again."""
    argv = ["srun", "-v", "--unbuffered", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}",
            f"--kill-on-bad-exit={0 if survivors_stay else 1}", f"--export={','.join(['ALL', *env])}"]
    if cpus_per_task:
        argv.append(f"--cpus-per-task={cpus_per_task}")
    if gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    if overlap:
        argv.append("--overlap")
    if job_id is not None:
        argv.append(f"--jobid={job_id}")
    return argv + list(extra) + list(command)


def parse_report(line: str) -> TaskReport | None:
    """A task report from one line of srun's stderr, or None."""
    if m := _TASKS.match(line.strip()):
        return TaskReport(m.group(1), tuple(_task_ids(m.group(2))), m.group(3).strip())
    if m := _NODE_FAILURE.match(line.strip()):
        return TaskReport(m.group(1), (), "node failure")
    return None


def parse_step_id(line: str) -> int | None:
    """The id of the step srun created, from its `-v` line."""
    m = _STEP.match(line.strip())
    return int(m.group(2)) if m else None


def _task_ids(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out
