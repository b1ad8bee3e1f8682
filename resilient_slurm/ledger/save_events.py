"""Saving: saves and their failures, emergency plans, retention, buddy and cold copies, the interval."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.ledger.kinds import Details, Kind


@dataclass(frozen=True, kw_only=True)
class Save(Details):
    """A checkpoint was committed."""

    KIND = Kind.SAVE
    reason: str
    """periodic, exponential, time, milestone, emergency, final, pause."""
    mode: str
    """sync or async."""
    path: str
    bytes: int
    seconds: float
    blocking_s: float
    """Time the training loop was blocked by it."""
    has_optimizer: bool
    replaced_to: str | None = None
    """Where an existing directory of the same step (one that failed verification) was moved."""
    plan: str | None = None
    """The emergency plan it followed."""


@dataclass(frozen=True, kw_only=True)
class SaveFailed(Details):
    KIND = Kind.SAVE_FAILED
    reason: str
    mode: str
    error: str | None


@dataclass(frozen=True, kw_only=True)
class SaveSkipped(Details):
    KIND = Kind.SAVE_SKIPPED
    reason: str
    why: str


@dataclass(frozen=True, kw_only=True)
class EmergencyPlan(Details):
    KIND = Kind.EMERGENCY_PLAN
    signal: str | None
    plan: str
    budget_s: float | None
    estimate_s: float
    reason: str
    save_in_flight: bool


@dataclass(frozen=True, kw_only=True)
class Retention(Details):
    KIND = Kind.RETENTION
    deleted: list[int]
    optimizer_stripped: list[int]


@dataclass(frozen=True, kw_only=True)
class RetentionFailed(Details):
    KIND = Kind.RETENTION_FAILED
    error: str


@dataclass(frozen=True, kw_only=True)
class BuddyCopy(Details):
    """A node-local hot tier: every node's files of a committed checkpoint copied to its buddy node."""

    KIND = Kind.BUDDY_COPY
    bytes: int
    seconds: float
    ok: bool
    problems: list[str]
    """Files that did not arrive whole (the checkpoint then survives only on its own nodes)."""


@dataclass(frozen=True, kw_only=True)
class ColdCopy(Details):
    KIND = Kind.COLD_COPY
    path: str
    bytes: int
    seconds: float
    verified: bool


@dataclass(frozen=True, kw_only=True)
class ColdCopyFailed(Details):
    KIND = Kind.COLD_COPY_FAILED
    path: str
    error: str


@dataclass(frozen=True, kw_only=True)
class ColdCopyCancelled(Details):
    KIND = Kind.COLD_COPY_CANCELLED
    reason: str


@dataclass(frozen=True, kw_only=True)
class ColdCopyDeferred(Details):
    KIND = Kind.COLD_COPY_DEFERRED
    reason: str


@dataclass(frozen=True, kw_only=True)
class ColdRetention(Details):
    KIND = Kind.COLD_RETENTION
    deleted: list[int]
    optimizer_stripped: list[int]


@dataclass(frozen=True, kw_only=True)
class ColdRetentionFailed(Details):
    KIND = Kind.COLD_RETENTION_FAILED
    error: str


@dataclass(frozen=True, kw_only=True)
class CheckpointInterval(Details):
    """The Young-Daly interval changed."""

    KIND = Kind.CHECKPOINT_INTERVAL
    interval_s: float
    young_daly_s: float
    save_cost_s: float
    mtbf_h: float
    failures: int
    exposure_h: float
    bounds_s: list[float]
