"""Starting a benchmark evaluation beside training, from rank 0, without waiting for it.

`SideEvaluations` is the trainer's whole hook: `due(step)` says whether a step's checkpoint is to be
evaluated (every `eval.harness.every_steps`, and the last step); `launch(step, root)` pins that
checkpoint against retention and starts `python -m resilient_slurm.evaluate RUN --step N` as
- a child process in a session of its own (a signal to the run does not reach it), at the lowest
  CPU priority with one thread (it shares the machine with training), its output in
  `evals/step_N/eval.log`; or
- a Slurm job of its own (`slurm/sbatch.py`): one task, `eval.harness.gpus` GPUs, the run's
  partition, account and qos unless eval.harness sets them, the cluster's setup lines, so it
  starts in the same environment as the training job. The script is `batch_script`, pure.
`launch` never raises: a launch that fails is recorded (`eval_failed`) and training goes on.
Both return at once; the evaluation writes its own results (`job.py`).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from resilient_slurm.checkpoint import store
from resilient_slurm.config import Config
from resilient_slurm.evaluate.job import PIN_HOLDER, work_dir
from resilient_slurm.ledger import EvalFailed, EvalLaunched, EventLog
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.slurm.sbatch import sbatch

log = logging.getLogger("resilient_slurm")


def command(run_dir: Path, step: int, where: str) -> list[str]:
    return [sys.executable, "-m", "resilient_slurm.evaluate", str(run_dir), "--step", str(step), "--where", where]


def batch_script(cfg: Config, run_dir: Path, step: int) -> str:
    """The evaluation job's batch script. Pure."""
    h, k = cfg.eval.harness, cfg.cluster
    out = work_dir(run_dir, step) / "eval.log"
    options = [f"--job-name=eval-{run_dir.name}-{step}", f"--output={out}", "--open-mode=append", "--nodes=1",
               "--ntasks=1", f"--time={h.time_min}"]
    if h.gpus:
        options.append(f"--gpus={h.gpus}")
    for flag, value in (("partition", h.partition or k.partition), ("account", h.account or k.account),
                        ("qos", k.qos)):
        if value:
            options.append(f"--{flag}={value}")
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in options), *k.setup,
             "exec " + shlex.join(command(run_dir, step, "slurm"))]
    return "\n".join(lines) + "\n"


class SideEvaluations:
    def __init__(self, cfg: Config, run_dir: Path, events: EventLog, rank: int) -> None:
        self.cfg, self.run_dir, self.events, self.rank = cfg, run_dir, events, rank
        h = cfg.eval.harness
        self.every = h.every_steps if h.tasks else 0
        self.where = h.launcher if h.launcher != "auto" else ("slurm" if cfg.cluster.kind == "slurm" else "local")
        self.children: list[subprocess.Popen[bytes]] = []

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.cfg.train.max_steps)

    def launch(self, step: int, checkpoint_root: Path) -> None:
        """Rank 0: start the evaluation of step `step`'s checkpoint (saved or being saved under
        `checkpoint_root`); other ranks do nothing."""
        if self.rank != 0:
            return
        self.children = [c for c in self.children if c.poll() is None]  # reap the finished ones
        tasks = list(self.cfg.eval.harness.tasks)
        pin = None
        try:
            pin = store.pin(checkpoint_root, step, PIN_HOLDER)
            work = work_dir(self.run_dir, step)
            work.mkdir(parents=True, exist_ok=True)
            if self.where == "slurm":
                ok, answer = sbatch(batch_script(self.cfg, self.run_dir, step), env=eval_env(os.environ))
                if not ok:
                    raise RuntimeError(answer)
                self.events.emit(EvalLaunched(tasks=tasks, where="slurm", eval_job_id=answer,
                                              log=str(work / "eval.log")), step)
                log.info("step %d: benchmark evaluation submitted as Slurm job %s", step, answer)
                return
            # Lowest CPU priority and one thread from its first instruction (its imports included).
            nice = ["nice", "-n", "19"] if shutil.which("nice") else []
            env = {**eval_env(os.environ), "OMP_NUM_THREADS": "1"}
            with open(work / "eval.log", "ab") as out:
                child = subprocess.Popen(nice + command(self.run_dir, step, "local"), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
            self.children.append(child)
            self.events.emit(EvalLaunched(tasks=tasks, where="local", pid=child.pid, log=str(work / "eval.log")), step)
            log.info("step %d: benchmark evaluation started (pid %d, log %s)", step, child.pid, work / "eval.log")
        except Exception as e:  # noqa: BLE001 - an evaluation must not stop training
            if pin is not None:
                store.unpin(pin)
            error = f"{type(e).__name__}: {e}"
            self.events.emit(EvalFailed(error=f"launch: {error}", attempt=1, final=True), step)
            log.warning("step %d: the benchmark evaluation did not start: %s", step, error)


# The training rank's process-group and supervision settings: inherited, they would make lm-eval's
# accelerate join the training's rendezvous (its port is taken: EADDRINUSE) and the child beat as a rank.
RANK_ENV = (*RankLaunch.names(), "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")


def eval_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment an evaluation starts in: the training's, less what makes a process a rank. Pure."""
    return {k: v for k, v in environ.items()
            if k not in RANK_ENV and not k.startswith("TORCHELASTIC_")}
