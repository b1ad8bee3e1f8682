"""The srun steps a driver runs, and what srun says about them as their stderr arrives.

One start of training is a `Generation`: at first one srun step of every rank; after a restart
inside the surviving processes, those steps go on and a replacement step joins for each lost
node. The generation's attempt key is its newest step's id (every rank writes under it from the
restart on), and only the reports that came after it began name its failures.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from resilient_slurm.slurm import scontrol, srun
from resilient_slurm.supervise.conclusion import DriverMove


NAMING_S = 2.0
"""How long a kill waits for srun to name its step: srun names it (`-v`) before it launches a task,
so a name still unread is one line away."""


@dataclass
class Srun:
    proc: subprocess.Popen[bytes]
    launched_at: float
    nodes: tuple[str, ...]
    step_id: int | None = None
    named: threading.Event = field(default_factory=threading.Event)
    """Set once srun said which step it created (its `-v` line)."""
    owner: Generation | None = None
    """The generation its reports belong to (a standby's changes when it is woken)."""
    lender: str | None = None
    """The job its step runs in when that is not the driver's own: a spare top-up's."""

    def kill(self, job_id: str) -> tuple[bool, str]:
        """SIGKILL to every task of its step. An srun that named no step launched no task (it is
        still waiting for nodes the job's other steps hold): srun alone is ended. Never the whole
        job: `scancel --signal=KILL JOB` cancels it, and every step of it."""
        if self.proc.poll() is not None:
            return True, ""
        self.named.wait(NAMING_S)
        if self.step_id is None:
            self.proc.kill()
            return True, ""
        return scontrol.kill_step(self.lender or job_id, self.step_id)


@dataclass
class Generation:
    sruns: list[Srun]
    number: int = 0
    step_id: int | None = None
    """The attempt key's step: the first srun's, then each restart's replacement step."""
    reports: list[srun.TaskReport] = field(default_factory=list)
    report_times: list[float] = field(default_factory=list)
    origin: int | None = None
    """How many reports came before the step was being torn down: the rest are consequences."""
    move: DriverMove | None = None
    """The move the driver stopped this step for (a shrunk run growing back, a straggler swapped out)."""
    lost: list[str] = field(default_factory=list)
    """Nodes whose tasks ended without a trace, found while judging a restart in the processes."""

    @property
    def launched_at(self) -> float:
        return self.sruns[-1].launched_at

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.sruns[0].nodes

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The first step's srun: a signal to it reaches every task of it."""
        return self.sruns[0].proc

    def running(self) -> bool:
        return any(s.proc.poll() is None for s in self.sruns)

    def start(self, argv: list[str], nodes: tuple[str, ...], env: dict[str, str] | None = None,
              lender: str | None = None) -> Srun:
        """One more srun of this generation (a step of the `lender` job's, when it is not the
        driver's own); its stderr is read (and passed on) by a thread."""
        # stdout is the job's log, inherited; stderr is read for srun's reports.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        s = Srun(proc, time.time(), nodes, owner=self, lender=lender)
        self.sruns.append(s)
        threading.Thread(target=_read, args=(s,), name="srun-stderr", daemon=True).start()
        return s

    def adopt(self, s: Srun) -> None:
        """A standby's srun joins this generation: it is waited for, and its reports are this one's."""
        s.owner = self
        self.sruns.append(s)

    def next(self, step_id: int) -> None:
        """A restart inside the processes began: a new attempt key, its own reports from now on."""
        self.number += 1
        self.step_id = step_id
        self.reports, self.report_times, self.origin = [], [], None

    @property
    def origin_reports(self) -> list[srun.TaskReport]:
        return self.reports[: len(self.reports) if self.origin is None else self.origin]


def _read(s: Srun) -> None:
    """srun's stderr, passed on; its step id and task reports go to the generation that owns it."""
    assert s.proc.stderr is not None
    for raw in s.proc.stderr:
        line = raw.decode("utf-8", "replace")
        sys.stderr.write(line)
        gen = s.owner
        assert gen is not None
        if s.step_id is None and (step_id := srun.parse_step_id(line)) is not None:
            s.step_id = step_id
            if gen.step_id is None:
                gen.step_id = step_id
            s.named.set()
        report = srun.parse_report(line)
        if report is not None:
            gen.reports.append(report)
            gen.report_times.append(time.time())
        elif "Terminating StepId" in line and gen.origin is None:
            gen.origin = len(gen.reports)
    s.named.set()
    sys.stderr.flush()
