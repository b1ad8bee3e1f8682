"""Hyperparameter search: the study's ledger (sweeps/<name>/events.jsonl), and a trial's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger.kinds import Details, Kind


@dataclass(frozen=True, kw_only=True)
class ConfigChanged(Details):
    """A relaunch changed keys that define what the run computes, as a change the launcher was
    explicitly allowed to make (PBT's explore step, launch/rundir.AllowedChange); the run resumes
    with the new values."""

    KIND = Kind.CONFIG_CHANGED
    changed: dict[str, Any]
    """key -> [old, new]."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class Paused(Details):
    """The run reached train.pause_at_step, saved, and ended the attempt to be launched again."""

    KIND = Kind.PAUSED
    saved: bool
    """The step's checkpoint is committed (False: the save failed; the run resumes from an older one)."""


@dataclass(frozen=True, kw_only=True)
class SweepStarted(Details):
    """A controller took over the study: the first time, or again after it was stopped or killed."""

    KIND = Kind.SWEEP_STARTED
    study: str
    resumed: bool
    trials: int
    """Trials the study held already."""
    running: int
    """Of those, trials not finished yet (running, paused or waiting to be launched): re-attached or
    resumed."""


@dataclass(frozen=True, kw_only=True)
class TrialLaunched(Details):
    """The controller started a trial's run (written to the study's ledger and to the trial's)."""

    KIND = Kind.TRIAL_LAUNCHED
    trial: int
    run: str
    target_step: int
    """The step it runs to: a pause (rung, generation) or train.max_steps."""
    why: str
    params: dict[str, Any]
    job: str | None = None
    """The Slurm job id (trials on a cluster)."""
    pid: int | None = None
    """The launcher's process id (local trials)."""


@dataclass(frozen=True, kw_only=True)
class TrialPaused(Details):
    KIND = Kind.TRIAL_PAUSED
    trial: int
    run: str
    value: float | None
    """The objective at the pause."""


@dataclass(frozen=True, kw_only=True)
class TrialPromoted(Details):
    """ASHA: a paused trial is in the best 1/reduction_factor of its rung and goes on to the next."""

    KIND = Kind.TRIAL_PROMOTED
    trial: int
    run: str
    rung: int
    """The rung it was promoted from (0 = the first)."""
    value: float
    target_step: int


@dataclass(frozen=True, kw_only=True)
class TrialFinished(Details):
    KIND = Kind.TRIAL_FINISHED
    trial: int
    run: str
    value: float | None
    """The objective: the metric's last value; None when the run never wrote it."""


@dataclass(frozen=True, kw_only=True)
class TrialPruned(Details):
    """A trial stopped early (written to the study's ledger and to the trial's): a pruner's verdict,
    with its job cancelled, or an ASHA trial left at its rung when the search ended."""

    KIND = Kind.TRIAL_PRUNED
    trial: int
    run: str
    value: float | None
    reason: str
    job: str | None = None
    """The cancelled Slurm job."""


@dataclass(frozen=True, kw_only=True)
class TrialFailed(Details):
    KIND = Kind.TRIAL_FAILED
    trial: int
    run: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class PbtGeneration(Details):
    """PBT: every member reached the generation's step; the decision, recorded before it is applied."""

    KIND = Kind.PBT_GENERATION
    generation: int
    scores: list[list[Any]]
    """[trial, objective] of each member, best first (objective None: it has none yet)."""
    exploits: list[dict[str, Any]]
    """{recipient, donor, params}: the recipient copies the donor's checkpoint and continues with params."""


@dataclass(frozen=True, kw_only=True)
class Exploit(Details):
    """PBT lineage: a member continues from another's checkpoint (in the study's ledger and in both
    members' ledgers)."""

    KIND = Kind.EXPLOIT
    generation: int
    recipient: str
    donor: str
    recipient_trial: int
    donor_trial: int
    source: str
    """The donor's checkpoint directory."""
    checkpoint: str
    """Its copy, the recipient's newest checkpoint."""


@dataclass(frozen=True, kw_only=True)
class Explore(Details):
    """PBT: the hyperparameters a member continues with after an exploit."""

    KIND = Kind.EXPLORE
    trial: int
    run: str
    changed: dict[str, Any]
    """key -> [donor's value, new value]."""
    how: dict[str, Any]
    """key -> perturb xF, resample or neighbour."""
