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
    schedule: str = "cosine"
    """cosine (warmup, then cosine decay over the run) or wsd (warmup, stable at lr, decay at the end)."""
    decay_fraction: float = 0.1
    """wsd: the last fraction of the steps that decays to lr * min_lr_ratio."""
    decay_steps: int = 0
    """wsd: decay over this many last steps instead (0: decay_fraction); an anneal from step S: max_steps=S+N."""
    decay_shape: str = "linear"
    """wsd: linear, cosine or sqrt (1 - sqrt of the decay's progress)."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.lr > 0, f"optim.lr: {self.lr}; set a learning rate > 0")
        p.need(self.schedule in ("cosine", "wsd"), f"optim.schedule: {self.schedule!r}; use cosine or wsd")
        p.need(0 < self.decay_fraction <= 1 and self.decay_steps >= 0,
               f"optim.decay_fraction: {self.decay_fraction}; set it within (0, 1], and optim.decay_steps >= 0")
        p.need(self.decay_shape in ("linear", "cosine", "sqrt"),
               f"optim.decay_shape: {self.decay_shape!r}; use linear, cosine or sqrt")
        p.need(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio: {self.min_lr_ratio}; set it within [0, 1]")
        p.need(self.grad_clip >= 0, f"optim.grad_clip: {self.grad_clip}; set it >= 0 (0 disables clipping)")
        return p


@dataclass
class TrainConfig:
    max_steps: int = 300
    """Optimizer steps of the whole run; the run finishes (final save, hf/) on reaching it."""
    max_tokens: int = 0
    """A budget in trained tokens instead of max_steps: ceil(max_tokens / (global_batch_size * seq_len)) steps (0: off)."""
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
        p.need(self.max_tokens >= 0, f"train.max_tokens: {self.max_tokens}; set it >= 0 (0 = train.max_steps)")
        p.need(self.log_every_steps >= 1, f"train.log_every_steps: {self.log_every_steps}; set it to 1 or more")
        p.need(self.pause_at_step >= 0, f"train.pause_at_step: {self.pause_at_step}; set it >= 0 (0 = never)")
        return p
