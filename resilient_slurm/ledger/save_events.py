"""Saving: saves and their failures, emergency plans, retention, buddy and cold copies, the interval."""

from __future__ import annotations

from dataclasses import dataclass, field

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
class MemorySave(Details):
    """A save to the memory tier (`checkpoint.memory`) ended: committed in every node's host memory
    and copied to the buddy nodes, or failed (the disk tiers are not affected either way)."""

    KIND = Kind.MEMORY_SAVE
    path: str
    """The step's directory on rank 0's node."""
    bytes: int
    """Tensor and JSON bytes of the whole checkpoint (every rank's)."""
    blocking_s: float
    """Time the save call held up the loop (rank 0)."""
    waited_s: float
    """Of that, waiting for the previous memory save to finish (it was still running)."""
    copy_s: float
    """From the save call until this rank's bytes were out of the live tensors: the longest an
    optimizer step right after the save could have waited (`MemoryTier.guard`)."""
    seconds: float
    """From the save call to committed in memory on every node, buddy copies not included."""
    buddy_bytes: int
    buddy_seconds: float
    ok: bool
    problems: list[str] = field(default_factory=list)
    """Why it failed, or files that did not reach a buddy (the step then survives only where it was written)."""


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
