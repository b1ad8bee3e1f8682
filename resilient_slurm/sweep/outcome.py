"""How a trial's latest launch ended, from its run's ledger. Pure.

Only the events after the launch count (the controller writes `trial_launched` into the run's
ledger; a Slurm submission writes `submitted` just before). The last conclusive one decides: a
finish, a pause, a give-up or failure, or a stop (the run saved after a signal); a pruning decides
whatever followed it. Asked
only once the job or process is gone: while a Slurm job lives, a crash or a stop is followed by a
requeue.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from resilient_slurm.ledger import Crash, Event, GaveUp, Hang, Kind, RankExit, TrialPruned


class Ended(str, Enum):
    FINISHED = "finished"
    PAUSED = "paused"
    PRUNED = "pruned"
    STOPPED = "stopped"
    """Saved after a signal and exited, to be resumed: a local trial whose controller went away."""
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    ended: Ended
    step: int | None
    reason: str


_CONCLUSIVE = (Kind.FINISH, Kind.PAUSED, Kind.GAVE_UP, Kind.STOP, Kind.CRASH, Kind.HANG,
               Kind.RANK_EXIT)


def since_launch(events: list[Event[Any]]) -> list[Event[Any]]:
    """The events of the latest launch."""
    marks = [i for i, e in enumerate(events) if e.kind in (Kind.TRIAL_LAUNCHED, Kind.SUBMITTED)]
    return events[marks[-1] + 1:] if marks else events


def classify(events: list[Event[Any]], how_it_ended: str) -> Outcome:
    """`events`: the run's ledger; `how_it_ended`: the job's final state or the process's exit
    status, for the reason when the ledger says nothing."""
    recent = since_launch(events)
    pruned = [e for e in recent if isinstance(e.details, TrialPruned)]
    if pruned:  # whatever the job did after its cancel (a stop, even a finish) follows from it
        return Outcome(Ended.PRUNED, pruned[-1].step, pruned[-1].details.reason)
    last = [e for e in recent if e.kind in _CONCLUSIVE]
    if not last:
        return Outcome(Ended.FAILED, None, f"ended ({how_it_ended}) without a trace in its ledger")
    e = last[-1]
    d = e.details
    if e.kind is Kind.FINISH:
        return Outcome(Ended.FINISHED, e.step, "finished")
    if e.kind is Kind.PAUSED:
        return Outcome(Ended.PAUSED, e.step, "paused")
    if e.kind is Kind.STOP:
        return Outcome(Ended.STOPPED, e.step, f"stopped ({how_it_ended}) after an emergency save")
    if isinstance(d, GaveUp):
        return Outcome(Ended.FAILED, e.step, f"gave up: {d.reason}")
    if isinstance(d, (Crash, Hang)):
        what = d.error if isinstance(d, Crash) else f"hang: {d.reason}"
        return Outcome(Ended.FAILED, e.step, f"crashed: {what.strip().splitlines()[0] if what else 'unknown'}")
    assert isinstance(d, RankExit)
    return Outcome(Ended.FAILED, e.step, f"rank {d.failed_rank} exited with {d.returncode}")
