"""`checkpoint.*`: when to save, where, how many to keep, the cold tier."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems


@dataclass
class ColdTierConfig:
    url: str = ""
    """Cold tier: a shared filesystem path or any fsspec URL (s3://bucket/prefix); empty = off.
    Each committed checkpoint is copied to <url>/<experiment>/<run>/ in the background, read back
    to verify it, and kept by the rules below; a run whose hot tier is empty resumes from here.
    Credentials and endpoints come from the store's own environment (S3: AWS_* variables,
    AWS_ENDPOINT_URL for a non-AWS server)."""
    keep_last: int = 10
    """Retention in the cold tier: keep the newest K copies (at least 2)."""
    keep_every_steps: int = 0
    """Milestones kept forever in the cold tier (0 = none)."""
    optimizer_on_last: int = 2
    """Keep optimizer state only on the newest M copies in the cold tier (0 = on all)."""


@dataclass
class MemoryTierConfig:
    every_steps: int = 0
    """Save to host memory every N steps (0 = off): each rank's shards go to files under `dir` on
    its own node, are copied to a buddy node's memory, and a restart loads from there before the
    disk tiers. The loop waits only until the state is copied out of the live tensors (on a GPU,
    the device-to-host copy)."""
    dir: str = "/dev/shm/resilient_slurm"
    """Where each node keeps the tier: <dir>/<experiment>/<run>/, in memory that outlives the
    process (tmpfs); `%n` becomes the node's name (needed only when several nodes share a machine)."""
    keep_last: int = 1
    """Memory checkpoints each node keeps (1 or 2), besides the one being written."""


@dataclass
class CheckpointConfig:
    every_steps: int = 1000
    """Save every N steps (0 = off): milestones."""
    exponential_first_step: int = 0
    """Exponential policy: save at E, 2E, 4E, ... (0 = off)."""
    every_minutes: float = 30.0
    """Save when this many minutes passed since the last save (0 = off): bounds what a fault can cost."""
    keep_last: int = 5
    """Retention: keep the newest K checkpoints (at least 2: the newest may be mid-save)."""
    keep_every_steps: int = 0
    """Milestones: checkpoints at multiples of this step are never deleted (0 = none)."""
    optimizer_on_last: int = 2
    """Keep optimizer state only on the newest M checkpoints (0 = on all)."""
    save_final: bool = True
    max_shard_bytes: int = 1 << 30
    """Split weights and optimizer state into files of at most this size (bytes)."""
    io_threads: int = 4
    """Threads writing and reading shard files in parallel on each rank."""
    async_save: bool = True
    """Copy the state into reusable host buffers and write, check and commit it on a background
    thread: the loop blocks only for the copy. Final and emergency saves are always synchronous."""
    if_busy: str = "wait"
    """A save falls due while the previous one is still being written: wait for it, or skip."""
    on_failure: str = "continue"
    """A save failed (disk full, I/O error; the previous checkpoints stay): continue training, or
    stop the run (exit status 1, failure) at the next save point."""
    hot_dir: str = ""
    """Hot tier for the newest checkpoints: <hot_dir>/<experiment>/<run>/; empty = the run
    directory's checkpoints/. Without `%n`, every rank of the job must see the same directory.
    With `%n` (the node's name, e.g. /nvme/%n/ckpt) it is node-local: each node keeps the files its
    ranks write, and after each save copies them to a buddy node over the network, so a checkpoint
    survives the loss of any one node; a resume reads local, then buddy, then cold copies."""
    cold: ColdTierConfig = field(default_factory=ColdTierConfig)
    memory: MemoryTierConfig = field(default_factory=MemoryTierConfig)
    young_daly: bool = False
    """Set the time-based interval to sqrt(2 x save cost x MTBF) (Young-Daly) from the measured
    cost of saves (time the loop was blocked) and the failure rate seen in events.jsonl across
    attempts, within [min_interval_s, max_interval_s]; replaces every_minutes."""
    mtbf_prior_h: float = 24.0
    """Young-Daly, and whether a shrunk run grows back (supervise/driver.py): the mean time between
    failures assumed before any is observed (it counts as one failure in that much time, so
    observed failures move the estimate gradually)."""
    min_interval_s: float = 60.0
    max_interval_s: float = 3600.0
    prior_write_gb_per_s: float = 0.25
    """Emergency saves: checkpoint write speed assumed until a save of this run was measured."""
    emergency_reserve_s: float = 10.0
    """Emergency saves: seconds kept free at the end of the grace window to requeue and exit."""

    def problems(self) -> list[str]:
        p, c = Problems(), self
        p.need(c.keep_last >= 2, f"checkpoint.keep_last: {c.keep_last}; keep at least 2 (the newest may be mid-save)")
        p.need(c.every_steps >= 0 and c.exponential_first_step >= 0 and c.every_minutes >= 0,
               "checkpoint.every_steps: every_steps, exponential_first_step and every_minutes must be >= 0; "
               "use 0 to turn one off")
        p.need(c.optimizer_on_last >= 0,
               f"checkpoint.optimizer_on_last: {c.optimizer_on_last}; set it >= 0 (0 = on all)")
        p.need(c.max_shard_bytes >= 1 << 20,
               f"checkpoint.max_shard_bytes: {c.max_shard_bytes}; set at least 1 MiB (1048576)")
        p.need(c.io_threads >= 1, f"checkpoint.io_threads: {c.io_threads}; set it to 1 or more")
        p.need(c.if_busy in ("wait", "skip"), f"checkpoint.if_busy: {c.if_busy!r}; use wait or skip")
        p.need(c.on_failure in ("continue", "stop"), f"checkpoint.on_failure: {c.on_failure!r}; use continue or stop")
        p.need(c.cold.keep_last >= 2, f"checkpoint.cold.keep_last: {c.cold.keep_last}; keep at least 2")
        p.need(c.cold.optimizer_on_last >= 0 and c.cold.keep_every_steps >= 0,
               "checkpoint.cold.keep_every_steps: it and checkpoint.cold.optimizer_on_last must be >= 0; use 0 "
               "for none / on all")
        p.need(c.memory.every_steps >= 0, f"checkpoint.memory.every_steps: {c.memory.every_steps}; set it >= 0 (0 = off)")
        p.need(c.memory.keep_last in (1, 2), f"checkpoint.memory.keep_last: {c.memory.keep_last}; keep 1 or 2")
        p.need(c.memory.dir.startswith("/"), f"checkpoint.memory.dir: {c.memory.dir!r} is not an absolute path; use "
                                             "one on tmpfs, e.g. /dev/shm/resilient_slurm")
        p.need(0 < c.min_interval_s <= c.max_interval_s,
               "checkpoint.min_interval_s: must be > 0 and at most checkpoint.max_interval_s; fix one of them")
        p.need(c.mtbf_prior_h > 0, f"checkpoint.mtbf_prior_h: {c.mtbf_prior_h}; set it > 0")
        p.need(c.prior_write_gb_per_s > 0 and c.emergency_reserve_s >= 0,
               "checkpoint.prior_write_gb_per_s: must be > 0, and checkpoint.emergency_reserve_s >= 0; fix the "
               "value")
        return p
