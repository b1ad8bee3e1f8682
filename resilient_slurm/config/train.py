"""`optim.*` and `train.*`: the optimizer, its schedule, and the run's length and seed."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.config.checks import Problems


@dataclass
class OptimConfig:
    lr: float = 1e-4
    """Peak learning rate of AdamW, reached after the warmup, then decayed on a cosine."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    """Steps of linear warmup from 0 to lr (below train.max_steps)."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.lr > 0, f"optim.lr: {self.lr}; set a learning rate > 0")
        p.need(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio: {self.min_lr_ratio}; set it within [0, 1]")
        p.need(self.grad_clip >= 0, f"optim.grad_clip: {self.grad_clip}; set it >= 0 (0 disables clipping)")
        return p


@dataclass
class TrainConfig:
    max_steps: int = 300
    """Optimizer steps of the whole run; the run finishes (final save, hf/) on reaching it."""
    seed: int = 1234
    """Seeds the initial weights, the data order and dropout: two runs with one seed are identical."""
    log_every_steps: int = 10
    """Print a progress line every N steps (metrics.jsonl has every step)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: needed for bit-identical resume."""
    threads: int = 0
    """torch intra-op threads per rank; 0: the CPUs this process may use (its affinity mask, at most
    SLURM_CPUS_PER_TASK in a job) divided by the ranks on this node."""
    pause_at_step: int = 0
    """Save and end the attempt (exit status 75, a `paused` event) on reaching this step, to be
    launched again later with a later pause or none: how a search pauses a trial at an ASHA rung or
    a PBT generation (0 = never)."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.max_steps >= 1, f"train.max_steps: {self.max_steps}; set it to 1 or more")
        p.need(self.log_every_steps >= 1, f"train.log_every_steps: {self.log_every_steps}; set it to 1 or more")
        p.need(self.pause_at_step >= 0, f"train.pause_at_step: {self.pause_at_step}; set it >= 0 (0 = never)")
        return p
