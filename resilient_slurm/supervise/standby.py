"""Warm processes on the spare nodes (`cluster.standby`), for a restart inside the surviving processes.

A replacement rank started after the failure spends seconds before it can join: srun, the
interpreter, torch's imports. A standby paid them before: it is a one-task step on a spare whose task
got ready and waits (`runtime/rejoin.wake_path`). The driver wakes one into the next generation in
place of starting a replacement step there; it becomes that generation's step (`Generation.adopt`).
Standbys not woken are dismissed when the start ends, since the next start may use their nodes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from resilient_slurm.slurm import scontrol
from resilient_slurm.supervise.steps import Generation, Srun

EXIT_S = 10.0
"""How long a dismissed standby gets to exit before its step is killed."""


class Standbys:
    def __init__(self) -> None:
        self.pool = Generation([])
        """Their reports are nobody's until one is woken: a standby that dies is only not there."""

    def start(self, argv: Callable[[str], list[str]], spares: Sequence[str], per_node: int) -> None:
        for node in spares:
            for _ in range(per_node):
                self.pool.start(argv(node), (node,))

    def take(self, node: str) -> Srun | None:
        """A standby on `node` still running, whose step srun named; it leaves the pool."""
        for s in self.pool.sruns:
            if s.nodes == (node,) and s.proc.poll() is None and s.step_id is not None:
                self.pool.sruns.remove(s)
                return s
        return None

    def dismiss(self, job_id: str) -> None:
        """SIGTERM to each one's srun, which passes it on: its task, never woken, exits 0."""
        for s in self.pool.sruns:
            if s.proc.poll() is None:
                s.proc.terminate()
        for s in self.pool.sruns:
            try:
                s.proc.wait(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                if s.step_id is not None:
                    scontrol.kill_step(job_id, s.step_id)
                s.proc.kill()
                s.proc.wait()
        self.pool.sruns.clear()
