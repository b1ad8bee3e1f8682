"""Where each trial stood when the controller stopped, from the study's ledger. Pure.

The ledger records every decision before it is carried out (a promotion, a PBT generation) and
every start after it (`trial_launched` with the job id or pid), so a restarted controller knows,
per trial, whether it was running (re-attach), paused at a step, or waiting to be launched to a
target, and with which values. Terminal states come from Optuna's journal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from resilient_slurm.ledger import Event, PbtGeneration, TrialLaunched, TrialPaused, TrialPromoted


class Status(str, Enum):
    PENDING = "pending"
    """Asked, promoted or past a PBT generation: to be launched to its target."""
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CopyIntent:
    """PBT: before its next launch the trial copies this donor's checkpoint (at or before `step`)."""

    generation: int
    donor: int
    step: int
    how: dict[str, str]


@dataclass
class Replayed:
    status: Status = Status.PENDING
    target: int | None = None
    """The step the trial runs (or is to run) to; None: the strategy's first target."""
    why: str = "new"
    paused_at: int | None = None
    params: dict[str, Any] | None = None
    """Values it continues with when they differ from the asked ones (PBT)."""
    jobs: list[str] = field(default_factory=list)
    pid: int | None = None
    copy: CopyIntent | None = None


def replay(events: list[Event[Any]], next_step: dict[int, int]) -> dict[int, Replayed]:
    """Trial number -> where it stood. `next_step`: PBT, a generation's step -> the next one."""
    out: dict[int, Replayed] = {}
    for e in events:
        d = e.details
        if isinstance(d, TrialLaunched):
            r = out.setdefault(d.trial, Replayed())
            r.status, r.target, r.why, r.pid, r.copy = Status.RUNNING, d.target_step, d.why, d.pid, None
            r.params = dict(d.params)
            if d.job:
                r.jobs.append(d.job)
        elif isinstance(d, TrialPaused):
            r = out.setdefault(d.trial, Replayed())
            r.status, r.paused_at = Status.PAUSED, e.step
        elif isinstance(d, TrialPromoted):
            r = out.setdefault(d.trial, Replayed())
            r.status, r.target, r.why = Status.PENDING, d.target_step, f"promoted from rung {d.rung}"
        elif isinstance(d, PbtGeneration) and e.step is not None:
            for trial, _ in d.scores:
                r = out.setdefault(int(trial), Replayed())
                r.status, r.target, r.why = Status.PENDING, next_step.get(e.step), f"generation {d.generation + 1}"
            for x in d.exploits:
                r = out[int(x["recipient"])]
                r.params = dict(x["params"])
                r.copy = CopyIntent(d.generation, int(x["donor"]), e.step, dict(x.get("how", {})))
    return out
