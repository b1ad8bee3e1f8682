"""`monitor.*` and `health.*`: what is watched during training, and on the nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from resilient_slurm.config.checks import Problems
from resilient_slurm.config.sdc import SdcConfig


class FindingKind(str, Enum):
    """What the in-training monitor can find (monitor/detectors.py), as `monitor.rollback_on` and the
    ledger's anomaly events spell it: one catalog for the detectors and the config."""

    LOSS_NAN = "loss_nan"
    LOSS_SPIKE = "loss_spike"
    LOSS_PLATEAU = "loss_plateau"
    GRAD_EXPLOSION = "grad_explosion"
    GRAD_VANISHING = "grad_vanishing"
    THROUGHPUT_DROP = "throughput_drop"
    SLOW_RANK = "slow_rank"
    DATA_STALL = "data_stall"
    GPU_UNDERUTILIZED = "gpu_underutilized"
    GPU_HOT = "gpu_hot"
    GPU_MEMORY_FULL = "gpu_memory_full"
    GPU_ECC = "gpu_ecc"
    MEMORY_LEAK = "memory_leak"

    def __str__(self) -> str:
        return self.value


FINDINGS = tuple(k.value for k in FindingKind)


@dataclass
class StragglerConfig:
    """Stragglers, found by the monitor outside the training processes from every rank's step
    sections (resilient_slurm/monitor/stragglers.py): slow but alive."""

    factor: float = 1.5
    """A rank whose compute (forward, backward, optimizer; not the time it waits for its peers) is
    above this multiple of the other ranks' median ..."""
    steps: int = 20
    """... on this many consecutive steps is a straggler: a `straggler` event, its node in the node
    record (health.node_record) ..."""
    min_s: float = 0.05
    """... when it is also at least this many seconds slower, so jitter on tiny steps is no finding."""
    swap: bool = True
    """With the job's driver and a spare node: at the next checkpoint the step stops, and the next
    one runs with the spare in the straggler's place (its node is not used again in the allocation).
    With replica groups (cluster.replica_ft): at once, its group is replaced with the spare in the
    straggler's place (it heals from a live group and joins) while the others train on."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.factor > 1, f"monitor.straggler.factor: {self.factor:g} is not above 1 (a rank slower than "
                                f"the others by this factor is a straggler); set it above 1, e.g. 1.5")
        p.need(self.steps > 1, f"monitor.straggler.steps: {self.steps} is not above 1 (one slow step is noise, "
                               f"not a straggler); set it to 2 or more, e.g. 20")
        p.need(self.min_s >= 0, f"monitor.straggler.min_s: {self.min_s:g} is negative; set it >= 0")
        return p


@dataclass
class MonitorConfig:
    """In-training fault detection (resilient_slurm/monitor/detectors.py) and what to do about findings."""

    enabled: bool = True
    window: int = 50
    """Recent steps the robust statistics (median, MAD) are taken over."""
    min_history: int = 20
    """Steps of history before the relative detectors judge anything."""
    loss_spike_mads: float = 8.0
    """Spike: loss above median + this many MADs (0 disables) ..."""
    loss_spike_min_rise: float = 0.5
    """... and at least this fraction above the median, so a quiet window cannot trigger on noise."""
    plateau_steps: int = 1000
    """Report when the loss has not improved for this many steps (0 disables); never acted on."""
    plateau_min_improvement: float = 0.01
    grad_norm_max: float = 0.0
    """Explosion: gradient norm above this (0 disables the absolute limit) ..."""
    grad_norm_factor: float = 20.0
    """... or above this multiple of its recent median (0 disables)."""
    grad_vanish_below: float = 0.0
    """Vanishing: gradient norm at or below this."""
    throughput_drop_ratio: float = 0.5
    """Throughput drop: tokens/s below this fraction of the recent median ..."""
    throughput_drop_steps: int = 5
    """... for this many consecutive steps."""
    slow_rank_factor: float = 2.0
    """Slow rank: one rank's compute time above this multiple of the others' median (0 disables) ..."""
    slow_rank_min_s: float = 0.05
    """... and at least this many seconds slower, so millisecond jitter on tiny steps is no finding ..."""
    slow_rank_steps: int = 3
    """... on this many consecutive steps."""
    data_stall_s: float = 30.0
    """Data-loader stall: a rank waited longer than this for its batch (0 disables)."""
    hang_factor: float = 20.0
    """Hang: no step completed within this multiple of the median step time ..."""
    hang_floor_s: float = 300.0
    """... and never less than this."""
    hang_first_step_s: float = 900.0
    """Before any step has completed (start-up, first compile): the limit for the first step."""
    heartbeat_timeout_s: float = 6.0
    """A rank that reports no progress (a step, a micro-batch, a save phase) to the monitor outside
    the training processes (the local launcher of several ranks, or a Slurm job's driver) for this
    long, or for heartbeat_factor times its typical gap between beats when that is longer, is hung,
    whatever the cause: deadlocked, stuck in a collective, stopped, or on a node that is gone. The
    monitor names the rank the others wait for, dumps the stacks, ends the step, and the run
    restarts. 0 turns heartbeats off. Must be below cluster.collective_timeout_s, so a hang is found
    before the collectives time out. 6 s: a rank beats after every micro-batch, so a step of
    seconds is silent for well under it, and a found hang is on record (stacks included) within
    10 s; a loop with longer gaps gets its own limit from heartbeat_factor."""
    heartbeat_factor: float = 10.0
    """How many of a rank's typical gaps between progress beats (the median of its last 20) it may
    stay silent, when that is longer than heartbeat_timeout_s (0: the timeout alone)."""
    heartbeat_alive_s: float = 5.0
    """A training rank that sends neither progress nor liveness beats (twice a second, from a
    thread of its own) for this long is hung at once: its process is stopped, or gone with its node.
    5 s, not less: on an overloaded host (2 cores at load 7) a healthy rank's beats were 3 s late
    while its first optimizer step after a resume ran DTensor's sharding propagation, and a 3 s
    limit killed it as hung."""
    flight_recorder: int = 2000
    """Collectives PyTorch's flight recorder keeps per rank (TORCH_FR_BUFFER_SIZE; 0: off). Its
    entries are dumped beside the stacks when a hang is found, and by NCCL itself on a collective
    timeout (TORCH_NCCL_DUMP_ON_TIMEOUT), into the run's logs/."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    heartbeat_phase_s: float = 600.0
    """How long a phase that announces itself may stay silent: the start and the first step, a
    resume's load, a save, an evaluation, the export."""
    rollback_on: list[str] = field(default_factory=lambda: [FindingKind.LOSS_NAN.value, FindingKind.LOSS_SPIKE.value])
    """Findings that roll back to the checkpoint before the anomaly and skip its data window."""
    max_rollbacks: int = 3
    """Rollbacks per run; one more anomaly after that stops the run (do not requeue)."""
    rollback_skip_batches: int = 200
    """Global batches skipped after the restored checkpoint (PaLM skipped 200-500)."""
    rollback_lr_factor: float = 1.0
    """Multiply the learning rate by this at each rollback (1 keeps it)."""
    replay_verify: bool = True
    """After a restart, compare each recomputed step's loss with the value logged before the failure
    (`metrics-lost.jsonl`), bit for bit: a difference means the restored state or the machine is
    wrong (`monitor/replay.py`). On a GPU only with train.deterministic=true."""
    replay_max_fallbacks: int = 2
    """On a difference, set the copy that served aside and load the next (tier, then older
    checkpoint), at most this many times per attempt; a difference after that drains the node when
    the run's persistent differences narrow to one, and otherwise stops comparing."""
    rss_every_steps: int = 10
    """Read each rank's resident host memory every N steps, for the leak detector (0 disables)."""
    leak_window: int = 30
    """Leak: samples of resident memory (one every rss_every_steps) the slope is taken over ..."""
    leak_mb_per_step: float = 1.0
    """... rising at least this many MB per step (the median of the slopes between every two samples,
    so start-up growth and single jumps do not count) ..."""
    leak_min_growth_mb: float = 256.0
    """... and by at least this much over the window."""
    gpu_sample_s: float = 10.0
    """How often the NVML sampler thread reads GPU utilization, memory, temperature and ECC counters."""
    gpu_util_min_pct: float = 50.0
    gpu_temp_max_c: float = 85.0
    gpu_memory_max_frac: float = 0.98
    sdc: SdcConfig = field(default_factory=SdcConfig)
    """Silent data corruption: replicas compared after the update (config/sdc.py)."""

    def problems(self) -> list[str]:
        p, mon = Problems(), self
        unknown = sorted(set(mon.rollback_on) - set(FINDINGS))
        p.need(not unknown, f"monitor.rollback_on: unknown finding(s) {', '.join(unknown)}; use {', '.join(FINDINGS)}")
        p.need(mon.window >= 3 and 1 <= mon.min_history <= mon.window,
               "monitor.min_history: must be between 1 and monitor.window (window >= 3); fix one of them")
        p.need(mon.hang_floor_s > 0 and mon.hang_factor > 1,
               "monitor.hang_floor_s: must be > 0 and monitor.hang_factor > 1; raise them")
        p.need(mon.heartbeat_timeout_s >= 0 and mon.heartbeat_phase_s > 0,
               "monitor.heartbeat_timeout_s: must be >= 0 (0 = off) and monitor.heartbeat_phase_s > 0; fix the value")
        p.need(mon.heartbeat_factor >= 0 and mon.heartbeat_alive_s > 0 and mon.flight_recorder >= 0,
               "monitor.heartbeat_factor: must be >= 0, monitor.heartbeat_alive_s > 0 and monitor.flight_recorder "
               ">= 0; fix the value")
        p.extend_new(mon.straggler.problems())
        p.need(mon.replay_max_fallbacks >= 0,
               f"monitor.replay_max_fallbacks: {mon.replay_max_fallbacks}; set it >= 0 (0: never fall back)")
        p.need(mon.rss_every_steps >= 0 and mon.leak_window >= 3 and mon.leak_mb_per_step >= 0,
               "monitor.rss_every_steps: must be >= 0, monitor.leak_window >= 3 and monitor.leak_mb_per_step >= 0 "
               "(0 disables); fix the value")
        p.need(mon.max_rollbacks >= 0 and mon.rollback_skip_batches >= 0 and 0 < mon.rollback_lr_factor <= 1,
               "monitor.max_rollbacks: it and monitor.rollback_skip_batches must be >= 0, "
               "monitor.rollback_lr_factor in (0, 1]; fix the value")
        p.extend_new(mon.sdc.problems())
        return p


@dataclass
class NodeRecordPolicy:
    """How many marks of a kind within `window_h` keep a node out of new jobs (0: that kind never
    does). Read by resilient_slurm/health/node_policy.py."""

    window_h: float = 168.0
    xid: int = 2
    """Xid verdicts that took the node out (the exclude list already keeps it out `exclude_ttl_h`)."""
    sdc: int = 2
    """Silent data corruptions pinned on the node."""
    straggler: int = 3
    """Straggler verdicts (monitor.straggler)."""
    hang: int = 3
    """Hangs the node's ranks caused (the heartbeat monitor's culprits)."""

    def limits(self) -> dict[str, int]:
        return {"xid": self.xid, "sdc": self.sdc, "straggler": self.straggler, "hang": self.hang}

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.window_h > 0 and min(self.limits().values()) >= 0,
               "health.node_record_policy: window_h must be > 0 and every count >= 0 (0: that kind never "
               "excludes); fix the value")
        return p


@dataclass
class HealthConfig:
    """The job's own node-health checks (resilient_slurm/supervise/health_watch.py), in Slurm jobs."""

    preflight: bool = True
    """Check each node before training starts; a node that fails is refused and the job requeued without it."""
    check_every_s: float = 60.0
    """Check again this often while training (0: only at start)."""
    kernel_log: str | None = None
    """Read this file instead of the kernel log (/dev/kmsg); "%n" becomes the node name
    (as in Slurm's own file patterns)."""
    expect_gpus: int | None = None
    """GPUs each node must show (NVML); null: cluster.gpus_per_node when it is set."""
    drain: bool = False
    """Also drain a failing node with scontrol (needs Slurm operator rights; the Epilog does it otherwise)."""
    exclude_ttl_h: float = 24.0
    """How long a failing node stays on the exclude list (cluster.exclude_file)."""
    timeout_s: float = 30.0
    """A check that has not finished by then counts as a failed node, never a pass."""
    node_record: str | None = None
    """The cluster's node record (JSON lines on shared storage, one per cluster): Xid verdicts,
    stragglers, hang culprits and silent data corruptions are appended to it by every job, and a new
    job's exclude list starts from the nodes whose marks pass node_record_policy. null: none."""
    node_record_policy: NodeRecordPolicy = field(default_factory=NodeRecordPolicy)

    def problems(self) -> list[str]:
        p = Problems()
        p.extend_new(self.node_record_policy.problems())
        p.need(self.check_every_s >= 0 and self.timeout_s > 0 and self.exclude_ttl_h > 0,
               "health.check_every_s: must be >= 0, health.timeout_s and health.exclude_ttl_h > 0; fix the value")
        return p
