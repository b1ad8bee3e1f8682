"""`monitor.*` and `health.*`: what is watched during training, and on the nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems
from resilient_slurm.config.sdc import SdcConfig

FINDINGS = ("loss_nan", "loss_spike", "loss_plateau", "grad_explosion", "grad_vanishing", "throughput_drop",
            "slow_rank", "data_stall", "gpu_underutilized", "gpu_hot", "gpu_memory_full", "gpu_ecc", "memory_leak")


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
    heartbeat_timeout_s: float = 30.0
    """A rank that reports no progress (a step, a micro-batch, a save phase) to the monitor outside
    the training processes (the local launcher of several ranks, or a Slurm job's driver) for this
    long is hung, whatever the cause: stopped, deadlocked in a collective, or on a node that is gone.
    The monitor dumps the stacks, ends the step, and the run restarts. 0 turns heartbeats off.
    Must be below cluster.collective_timeout_s, so a hang is found before the collectives time out."""
    heartbeat_phase_s: float = 600.0
    """How long a phase that announces itself may stay silent: the start and the first step, a
    resume's load, a save, an evaluation, the export."""
    rollback_on: list[str] = field(default_factory=lambda: ["loss_nan", "loss_spike"])
    """Findings that roll back to the checkpoint before the anomaly and skip its data window."""
    max_rollbacks: int = 3
    """Rollbacks per run; one more anomaly after that stops the run (do not requeue)."""
    rollback_skip_batches: int = 200
    """Global batches skipped after the restored checkpoint (PaLM skipped 200-500)."""
    rollback_lr_factor: float = 1.0
    """Multiply the learning rate by this at each rollback (1 keeps it)."""
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
        p.need(mon.rss_every_steps >= 0 and mon.leak_window >= 3 and mon.leak_mb_per_step >= 0,
               "monitor.rss_every_steps: must be >= 0, monitor.leak_window >= 3 and monitor.leak_mb_per_step >= 0 "
               "(0 disables); fix the value")
        p.need(mon.max_rollbacks >= 0 and mon.rollback_skip_batches >= 0 and 0 < mon.rollback_lr_factor <= 1,
               "monitor.max_rollbacks: it and monitor.rollback_skip_batches must be >= 0, "
               "monitor.rollback_lr_factor in (0, 1]; fix the value")
        p.extend_new(mon.sdc.problems())
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

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.check_every_s >= 0 and self.timeout_s > 0 and self.exclude_ttl_h > 0,
               "health.check_every_s: must be >= 0, health.timeout_s and health.exclude_ttl_h > 0; fix the value")
        return p
