"""`fault.*`: fault injection for tests and drills."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FaultConfig:
    """Fault injection for tests and drills; everything off by default."""

    step_sleep_s: float = 0.0
    """Sleep this long in every step (on `ranks`): a slow GPU, or pacing for tests."""
    raise_at_step: int = 0
    """Raise an exception when this step begins (on `ranks`), on every attempt: a code bug."""
    nan_at_step: int = 0
    """Make the loss NaN at this step, with the data originally scheduled for it: a bad batch.
    After a rollback skips that data, the step runs clean."""
    hang_at_step: int = 0
    """Stop making progress at this step (on `ranks`): a hung GPU or a deadlock."""
    oom_at_step: int = 0
    """Raise torch.OutOfMemoryError, what the CUDA allocator raises, in the forward of this step (on
    `ranks`) while the micro-batch is data.micro_batch_size: a step that fits only at a smaller one."""
    cuda_error_at_step: int = 0
    """Raise the RuntimeError a CUDA illegal memory access raises when this step begins (on `ranks`),
    once per run: a fault after which the process's device state cannot be trusted."""
    leak_mb_per_step: float = 0.0
    """Keep this many more MB of host memory every step (on `ranks`): a leak."""
    ranks: list[int] = field(default_factory=list)
    """Ranks the faults apply to (empty: all)."""
    sdc_step: int = 0
    """Flip one bit in one parameter shard on rank `sdc_rank` after this step's update, once per run:
    a silent data corruption for the sentinel (monitor.sdc) to find. The lowest bit of the first
    element of the rank's first non-empty shard: no NaN, a loss no check would notice."""
    sdc_rank: int = 0
    """The rank whose shard `sdc_step` corrupts (not `ranks`: one rank, one bit)."""
