"""Faults, stops and decisions: anomalies, rollbacks, signals, crashes, out of memory, hangs, requeues,
restarts inside the allocation, node health, config changes, pauses, the finish."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger.kinds import Details, Kind


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
    """A stop signal (SIGUSR1, SIGUSR2, SIGTERM, SIGINT: Ctrl-C), recorded by each rank at the step
    boundary it acts on."""

    KIND = Kind.SIGNAL
    signal: str
    received: str
    """UTC time the signal arrived."""


@dataclass(frozen=True, kw_only=True)
class ForcedExit(Details):
    """A second Ctrl-C within a few seconds of the first: the local launcher killed the ranks at
    once, without a save (rank -1). Launching again resumes from the newest checkpoint."""

    KIND = Kind.FORCED_EXIT
    first: str
    """UTC time of the Ctrl-C that asked for the stop."""
    second: str
    """UTC time of the one that asked to exit at once."""
    ranks: list[int]
    """The ranks still running, killed."""


@dataclass(frozen=True, kw_only=True)
class Stop(Details):
    """A stop request was honoured after an emergency save."""

    KIND = Kind.STOP
    reason: str
    checkpoint: str | None
    data: dict[str, Any] | None = None
    """Where the data stands, as the data position's own `describe()` says: for a token mixture, each
    source's file, the offset in it and its epoch (the current data shard the emergency checkpoint
    resumes at)."""
    total_steps: int | None = None
    """The run's length, as the loop gave it (`Session.steps(n)`, the built-in trainer's own)."""


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
class PeerLost(Details):
    """A collective failed because a peer's process is gone; this rank tore its trainer and process
    group down and waits for the driver's word to restart in its process (runtime/rejoin.py). A
    consequence of the peer's failure, not a failure of its own."""

    KIND = Kind.PEER_LOST
    error: str
    teardown_s: float
    """From the start of the failed attempt's trainer to torn down (this rank's process stays)."""
    generation: int
    """The generation it waits to join."""


@dataclass(frozen=True, kw_only=True)
class Hang(Details):
    KIND = Kind.HANG
    reason: str
    waited_s: float
    limit_s: float
    stacks: str
    culprits: list[int] | None = None
    """The heartbeat monitor's: every rank the others wait for (this event's rank is one of them)."""
    nodes: list[str] | None = None
    """Their nodes."""
    collective: dict[str, Any] | None = None
    """The collective the others wait in: its group (name, desc), sequence number, the ranks waiting
    in it and the sequence number each culprit had reached (`monitor.heartbeats.Wavefront`)."""


@dataclass(frozen=True, kw_only=True)
class Straggler(Details):
    """A rank slow but alive: its compute above monitor.straggler.factor times the others' median on
    monitor.straggler.steps steps running (`monitor.stragglers`). Written as that rank, on its node."""

    KIND = Kind.STRAGGLER
    ratio: float
    compute_s: float
    others_s: float
    """The other ranks' median compute at the step it was found."""
    steps: int
    sections: dict[str, float]
    """Its step sections (s), averaged over its slow steps."""
    scores: dict[str, float]
    """Every rank's relative score (the others' median over its compute; below 1: slower)."""
    action: str
    """What follows: `swap` (its node swapped for a spare at the next checkpoint; with replica groups,
    its group replaced on the spare at once) or `report`."""
    group: int | None = None
    """With replica groups (cluster.replica_ft): its group, which a swap replaces."""


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
    total_steps: int | None = None
    """The run's length, as the loop gave it (`Session.steps(n)`, the built-in trainer's own)."""


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
    path: str | None = None
    """inprocess (the survivors went on in their processes, only the lost ranks started anew) or
    step (every process started anew)."""
    why: str | None = None
    """Why the path: for a step restart after a failure, why the survivors could not go on."""
    breakdown: dict[str, Any] | None = None
    """Seconds of each part of the restart: detect (failure to decision), teardown, placement,
    process_start (new processes only), rendezvous, load (and load_source: memory, buddy, hot,
    cold), data_ready, first_step. Parts may overlap (the survivors tear down while the driver
    decides); `latency_s` is the whole."""


@dataclass(frozen=True, kw_only=True)
class NodeUnhealthy(Details):
    KIND = Kind.NODE_UNHEALTHY
    bad_node: str
    action: str
    xid: int | None
    reason: str
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class ReplayMismatch(Details):
    """A step recomputed after a restart did not reproduce the value logged before the failure
    (`monitor.replay`): the restored state or the machine is wrong."""

    KIND = Kind.REPLAY_MISMATCH
    metric: str
    expected: float
    """The value `metrics-lost.jsonl` holds for the step (computed before the failure)."""
    got: float
    checkpoint: str
    """The checkpoint the state came from ..."""
    source: str
    """... and its tier (memory, buddy, hot, cold; peers on a node-local tier)."""
    nodes: list[str]
    """The nodes that restored and recomputed it (a loss is global: any of them)."""
    action: str
    """fallback (the copy set aside, the next loaded), drain (the one suspect node), or continue."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class ReplayChecked(Details):
    """The steps a restart recomputed, compared with the values logged before the failure: all
    equal (`compared` of them, `first` to the event's step), or not compared (`not_compared`)."""

    KIND = Kind.REPLAY_CHECKED
    compared: int
    first: int | None
    checkpoint: str
    source: str
    fallbacks: int = 0
    """Differences found (and fallen back from) before these matched."""
    not_compared: str | None = None


@dataclass(frozen=True, kw_only=True)
class Sdc(Details):
    """Silent data corruption: copies of a shard that must be equal bit for bit were not (replicas
    after the update, or a buddy's re-run of it; resilient_slurm/replica/), and what was done."""

    KIND = Kind.SDC
    check: str
    """replicas (HSDP replicas compared) or rerun (a buddy re-ran the update)."""
    tensors: list[str]
    """The parameters whose shards differed."""
    ranks: list[int]
    """The culprit ranks (empty: undecided)."""
    nodes: list[str]
    """Their nodes, taken out of the run."""
    suspects: list[str]
    """Undecided: the nodes one of which is wrong."""
    decided_by: str
    """majority (3+ copies), rerun (a third rank re-ran the update of two copies), or undecided."""
    evidence: list[dict[str, Any]]
    """Each copy's fingerprint of each differing tensor: rank, group, node, tensor, fingerprint,
    and `rerun_of` for a re-run's (the rank whose state it re-ran)."""
    action: str
    """healed (from `source`) or undecided (the run restarts from its newest checkpoint)."""
    source: str | None = None
    """Where the culprit's state came from: `group G` (a good replica) or `rank R` (the buddy's re-run)."""
    heal_s: float | None = None
    """Mismatch found -> every culprit shard healed."""
    verified: bool = False
    """Compared again after the heal: every copy equal."""
    reason: str = ""


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
