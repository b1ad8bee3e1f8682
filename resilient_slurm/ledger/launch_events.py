"""Launching and attempts: submitted, attempt, start, data ready, resume, config adjusted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger.kinds import Details, Kind


@dataclass(frozen=True, kw_only=True)
class Submitted(Details):
    """`launch` submitted the run as a Slurm job (the job id is in the header)."""

    KIND = Kind.SUBMITTED
    exclude: str | None = None
    """The --exclude value the job was submitted with."""


@dataclass(frozen=True, kw_only=True)
class Attempt(Details):
    """A Slurm attempt of the job began (rank 0, before training)."""

    KIND = Kind.ATTEMPT
    nodes: list[str]
    ntasks: int
    cause: str
    """Why this attempt runs: how the previous one ended."""


@dataclass(frozen=True, kw_only=True)
class Start(Details):
    """Rank 0 built the model and is about to resume or start."""

    KIND = Kind.START
    world_size: int
    pid: int
    host: str
    process_started: str | None = None
    """UTC time the process started: start-up counts as allocated time."""
    pids: list[int] | None = None
    """Every rank's process id, by rank: a kernel OOM-kill line names the pid."""
    hosts: list[str] | None = None
    """Every rank's host, by rank."""
    process_starts: list[str] | None = None
    """Every rank's process start (UTC), by rank: after a restart inside the surviving processes,
    only the replacements' are new ("" where unknown)."""
    rendezvous_s: float | None = None
    """The longest any rank took to join the process group."""


@dataclass(frozen=True, kw_only=True)
class ConfigAdjusted(Details):
    """A value the user did not set was changed at launch to fit the ones they did (config.Adjustment)."""

    KIND = Kind.CONFIG_ADJUSTED
    key: str
    old: int
    new: int
    why: str


@dataclass(frozen=True, kw_only=True)
class DataReady(Details):
    """The chat data is tokenized (or its cache mapped): its version and what became of its lines."""

    KIND = Kind.DATA_READY
    digest: str
    """sha256 of the data files' hashes: the data's version."""
    files: int
    rows: int
    """Packed training rows."""
    val_rows: int
    cache_hit: bool
    seconds: float
    counts: dict[str, Any]
    """Lines, conversations, skipped bad lines, truncated and dropped conversations, tokens."""


@dataclass(frozen=True, kw_only=True)
class DataPhase(Details):
    """The token mixture begins a new data phase here (`data.phase`): new sources or weights from this
    position on, the earlier phases' tokens kept (how a run anneals its mix)."""

    KIND = Kind.DATA_PHASE
    phase: str
    sources: dict[str, float]
    """Each source of the new phase and its weight."""
    sequences: int
    """The global position the phase begins at."""


@dataclass(frozen=True, kw_only=True)
class SourceEpoch(Details):
    """A source of the token mixture ran out and begins its next epoch (data.on_exhausted=repeat)."""

    KIND = Kind.SOURCE_EPOCH
    source: str
    epoch: int


@dataclass(frozen=True, kw_only=True)
class SourceExhausted(Details):
    """A source of the token mixture ran out with data.on_exhausted=stop: the run ends here."""

    KIND = Kind.SOURCE_EXHAUSTED
    source: str
    sequences: int


@dataclass(frozen=True, kw_only=True)
class Resume(Details):
    KIND = Kind.RESUME
    checkpoint: str
    has_optimizer: bool
    source: str
    """Where it was loaded from: memory (the nodes' own host memory), buddy (some from a buddy
    node's memory copy), hot, or cold (copied back into the hot tier first); on a node-local hot
    tier also buddy or peers (files brought from other nodes' disks)."""
    saved_world_size: int
    seconds: float | None = None
    """The load, from the first look at the tiers to the state in place."""


@dataclass(frozen=True, kw_only=True)
class CheckpointSkipped(Details):
    """A checkpoint (or a tier's copy) failed verification or loading and was passed over."""

    KIND = Kind.CHECKPOINT_SKIPPED
    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class RngReseeded(Details):
    KIND = Kind.RNG_RESEEDED
    why: str
