"""The run's ledger: `events.jsonl`, one JSON object per line, appended by every rank.

Each line has a UTC `time`, the `event` kind, the `step` and the writing `rank`; in Slurm jobs the
`job_id`, `restart` (requeue count), `job_step` and `node` of the attempt; then the fields of its kind. This module is the one
catalog of kinds and their fields: writers pass a typed `Details` (so the type checker sees every
field), readers get `Event`s back and narrow them with `select`. Lines are written with one
`write()` on an O_APPEND descriptor, so concurrent ranks never interleave within a line.

Reading is tolerant, because a ledger outlives the code that wrote it: a field a line lacks reads as
None, fields the catalog does not know are kept in `Event.record`, and a kind it does not know
reads as `Unknown`. Every ledger this version writes reads back exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar


class Kind(str, Enum):
    """Every kind of ledger event; the value is what `events.jsonl` spells."""

    SUBMITTED = "submitted"
    ATTEMPT = "attempt"
    START = "start"
    DATA_READY = "data_ready"
    RESUME = "resume"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    RNG_RESEEDED = "rng_reseeded"
    SAVE = "save"
    SAVE_FAILED = "save_failed"
    SAVE_SKIPPED = "save_skipped"
    EMERGENCY_PLAN = "emergency_plan"
    RETENTION = "retention"
    RETENTION_FAILED = "retention_failed"
    BUDDY_COPY = "buddy_copy"
    MEMORY_SAVE = "memory_save"
    COLD_COPY = "cold_copy"
    COLD_COPY_FAILED = "cold_copy_failed"
    COLD_COPY_CANCELLED = "cold_copy_cancelled"
    COLD_COPY_DEFERRED = "cold_copy_deferred"
    COLD_RETENTION = "cold_retention"
    COLD_RETENTION_FAILED = "cold_retention_failed"
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    ANOMALY = "anomaly"
    ROLLBACK = "rollback"
    GAVE_UP = "gave_up"
    SIGNAL = "signal"
    STOP = "stop"
    CRASH = "crash"
    OOM_RETRY = "oom_retry"
    OUT_OF_MEMORY = "out_of_memory"
    HOST_OOM = "host_oom"
    HANG = "hang"
    STACKS_DUMPED = "stacks_dumped"
    FINISH = "finish"
    EXPORTED = "exported"
    REQUEUE = "requeue"
    RESTART_IN_ALLOCATION = "restart_in_allocation"
    NODE_UNHEALTHY = "node_unhealthy"
    RANK_EXIT = "rank_exit"
    RANKS_KILLED = "ranks_killed"
    CONFIG_ADJUSTED = "config_adjusted"
    CONFIG_CHANGED = "config_changed"
    PAUSED = "paused"
    SWEEP_STARTED = "sweep_started"
    TRIAL_LAUNCHED = "trial_launched"
    TRIAL_PAUSED = "trial_paused"
    TRIAL_PROMOTED = "trial_promoted"
    TRIAL_FINISHED = "trial_finished"
    TRIAL_PRUNED = "trial_pruned"
    TRIAL_FAILED = "trial_failed"
    PBT_GENERATION = "pbt_generation"
    EXPLOIT = "exploit"
    EXPLORE = "explore"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Details:
    """The fields of one kind of event (subclasses); `KIND` names the kind."""

    KIND: ClassVar[Kind]


# --- launching and attempts -----------------------------------------------------------------------


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
class Resume(Details):
    KIND = Kind.RESUME
    checkpoint: str
    has_optimizer: bool
    source: str
    """Where it was loaded from: memory (the nodes' own host memory), buddy (some from a buddy
    node's memory copy), hot, or cold (copied back into the hot tier first); on a node-local hot
    tier also buddy or peers (files brought from other nodes' disks)."""
    saved_world_size: int


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


# --- saving ---------------------------------------------------------------------------------------


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


# --- faults, stops and decisions ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Anomaly(Details):
    """A monitor finding (monitor/detectors.py) and what was done about it."""

    KIND = Kind.ANOMALY
    kind: str
    """The finding: loss_nan, loss_spike, slow_rank, ..."""
    message: str
    evidence: dict[str, Any]
    action: str
    """The recovery action taken (rollback, give_up) or report."""


@dataclass(frozen=True, kw_only=True)
class Rollback(Details):
    KIND = Kind.ROLLBACK
    reason: str
    anomaly_step: int
    checkpoint: str | None
    skipped_batches: int
    skipped_positions: list[int]
    """[first, end) global sample positions skipped."""
    skipped_samples: list[int]
    lr_scale: float


@dataclass(frozen=True, kw_only=True)
class GaveUp(Details):
    """The run stops for good: do not requeue."""

    KIND = Kind.GAVE_UP
    reason: str


@dataclass(frozen=True, kw_only=True)
class Signal(Details):
    KIND = Kind.SIGNAL
    signal: str
    received: str


@dataclass(frozen=True, kw_only=True)
class Stop(Details):
    """A stop request was honoured after an emergency save."""

    KIND = Kind.STOP
    reason: str
    checkpoint: str | None


@dataclass(frozen=True, kw_only=True)
class Crash(Details):
    KIND = Kind.CRASH
    error: str
    traceback: str


@dataclass(frozen=True, kw_only=True)
class OomRetry(Details):
    """A rank ran out of device memory in a step's forward or backward: every rank redid the step
    at a smaller micro-batch, over the same global batch (more accumulation)."""

    KIND = Kind.OOM_RETRY
    ranks: list[int]
    """The ranks that ran out."""
    error: str
    """The first of them's error (first line)."""
    old_micro_batch: int
    new_micro_batch: int
    configured_micro_batch: int
    """data.micro_batch_size at the time: later starts with this value keep new_micro_batch."""
    accumulation: int
    """Micro-batches per rank and step at the new size."""
    memory: list[dict[str, float]]
    """Each rank's figures, by rank: max_allocated_bytes, reserved_bytes, total_bytes on CUDA;
    rss_bytes, max_rss_bytes on the host."""


@dataclass(frozen=True, kw_only=True)
class OutOfMemory(Details):
    """Out of device memory where a smaller micro-batch cannot help: the run gives up, with what to do."""

    KIND = Kind.OUT_OF_MEMORY
    phase: str
    """forward/backward (at micro-batch 1) or optimizer."""
    ranks: list[int]
    error: str
    micro_batch: int
    memory: list[dict[str, float]]
    reason: str


@dataclass(frozen=True, kw_only=True)
class HostOom(Details):
    """A rank's process was killed by the kernel's OOM killer: host memory ran out, the node is fine."""

    KIND = Kind.HOST_OOM
    killed_rank: int | None
    """None when only a cgroup's counter saw the kill, not which process it took."""
    pid: int | None
    source: str
    """kernel_log (a line naming the pid) or cgroup (an oom_kill counter that went up)."""
    evidence: str


@dataclass(frozen=True, kw_only=True)
class Hang(Details):
    KIND = Kind.HANG
    reason: str
    waited_s: float
    limit_s: float
    stacks: str


@dataclass(frozen=True, kw_only=True)
class StacksDumped(Details):
    KIND = Kind.STACKS_DUMPED
    reason: str
    waited_s: float
    stacks: str


@dataclass(frozen=True, kw_only=True)
class Finish(Details):
    KIND = Kind.FINISH
    tokens_seen: int


@dataclass(frozen=True, kw_only=True)
class Exported(Details):
    """The finished model was written for its users (hf/): in Hugging Face layout, or a LoRA adapter."""

    KIND = Kind.EXPORTED
    path: str
    checkpoint: str
    dtype: str
    files: int
    seconds: float
    format: str = "hf"
    """hf: a whole model; peft: a LoRA run's adapter."""


@dataclass(frozen=True, kw_only=True)
class Requeue(Details):
    """The job requeued itself (one task, by claim)."""

    KIND = Kind.REQUEUE
    reason: str
    ok: bool
    error: str | None = None
    exclude: list[str] | None = None
    """ExcNodeList set on the requeued job."""
    exclude_ok: bool | None = None
    exclude_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class RestartInAllocation(Details):
    """The job restarted training inside its allocation (a new job step), without the queue. The
    driver writes it once the new start took its first step (or ended without one), under the new
    start's attempt key; its step is the last one the previous start reached."""

    KIND = Kind.RESTART_IN_ALLOCATION
    cause: str
    """Why: the recovery decision's reason; for a grow back, the nodes back in service."""
    placement: str
    """Where it restarts: on a spare, on fewer nodes, in place, on more nodes again."""
    replaced: list[str]
    """Nodes taken out of the run."""
    added: list[str]
    """Spare nodes brought in (for a grow back: the nodes returned to service)."""
    latency_s: float | None = None
    """Seconds from the failure (a grow back: the driver's stop) to the new start's first step
    (None: it never took one)."""
    move: str | None = None
    """spare (a spare replaced a failed node), in place (no node was at fault), shrink (fewer
    nodes than cluster.nodes), grow (a shrunk run back on more nodes, at a checkpoint, after
    failed nodes were returned to service)."""
    nodes: list[str] | None = None
    """The nodes the new start runs on."""
    failed_at: str | None = None
    """UTC time the driver learned of the failure (srun's first report, or the step's end), or
    stopped the step to grow back."""
    process_s: float | None = None
    """Seconds from the failure (or the stop) to the new start's first process."""


@dataclass(frozen=True, kw_only=True)
class NodeUnhealthy(Details):
    KIND = Kind.NODE_UNHEALTHY
    bad_node: str
    action: str
    xid: int | None
    reason: str
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class RankExit(Details):
    """A local rank exited abnormally (the local launcher writes it)."""

    KIND = Kind.RANK_EXIT
    failed_rank: int
    returncode: int


@dataclass(frozen=True, kw_only=True)
class RanksKilled(Details):
    KIND = Kind.RANKS_KILLED
    ranks: list[int]
    reason: str


# --- hyperparameter search: the study's ledger (sweeps/<name>/events.jsonl), and a trial's own -------


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


@dataclass(frozen=True, kw_only=True)
class Unknown(Details):
    """A kind this version does not know (written by a newer one); its fields are in `record`."""

    KIND = Kind.UNKNOWN


CATALOG: dict[Kind, type[Details]] = {cls.KIND: cls for cls in Details.__subclasses__()}
FAILURES = (Kind.CRASH, Kind.HANG, Kind.OUT_OF_MEMORY, Kind.HOST_OOM)
"""Events that mean an attempt failed."""

D = TypeVar("D", bound=Details)


@dataclass(frozen=True)
class Event(Generic[D]):
    """One ledger line: the header every line has, and the typed fields of its kind."""

    details: D
    time: str
    step: int | None
    rank: int
    job_id: str | None = None
    restart: int | None = None
    """SLURM_RESTART_COUNT: how often the job was requeued."""
    job_step: int | None = None
    """The Slurm job step the rank runs in: a new one for each start inside the same allocation."""
    node: str | None = None
    record: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The line as read or written, every field included."""

    @property
    def kind(self) -> Kind:
        return self.details.KIND


def parse(record: dict[str, Any]) -> Event[Details]:
    """One ledger line (a dict) as an Event."""
    try:
        kind = Kind(record.get("event"))
    except ValueError:
        kind = Kind.UNKNOWN
    cls = CATALOG[kind]
    values = {}
    for f in fields(cls):
        if f.name in record:
            values[f.name] = record[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            values[f.name] = None  # an older or torn writer: absent reads as None
    restart, job_step = record.get("restart"), record.get("job_step")
    return Event(
        details=cls(**values), time=str(record.get("time", "")), step=record.get("step"),
        rank=int(record.get("rank", 0)), job_id=None if record.get("job_id") is None else str(record["job_id"]),
        restart=None if restart is None else int(restart), job_step=None if job_step is None else int(job_step),
        node=record.get("node"), record=dict(record),
    )


def select(events: list[Event[Any]], cls: type[D]) -> list[Event[D]]:
    """The events of one kind, typed as that kind."""
    return [e for e in events if isinstance(e.details, cls)]


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventLog:
    def __init__(self, path: Path, rank: int = 0, context: dict[str, Any] | None = None) -> None:
        self.path = path
        self.rank = rank
        self.context = dict(context or {})
        """Header fields added to every event (job_id, restart, job_step, node)."""

    def emit(self, details: Details, step: int | None) -> Event[Details]:
        """Append one event. Optional fields left at None are not written."""
        body = {}
        for f in fields(details):
            value = getattr(details, f.name)
            if value is None and f.default is None:
                continue
            body[f.name] = value
        record = {"time": utc_now(), "event": details.KIND.value, "step": step, "rank": self.rank, **self.context,
                  **body}
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return parse(json.loads(line))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file; a torn line (a writer killed mid-line) is
    skipped, and no file means no lines."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_events(path: Path) -> list[Event[Details]]:
    """Every event of a ledger, in order."""
    return [parse(r) for r in read_jsonl(path) if isinstance(r, dict)]


def read_new_events(path: Path, offset: int) -> tuple[list[Event[Details]], int]:
    """The events written from byte `offset` on, and the offset to read from next: a reader that
    polls a growing ledger reads each line once. A line still being written waits for the next call."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    events = []
    for line in whole.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            events.append(parse(record))
    return events, offset + len(whole)
