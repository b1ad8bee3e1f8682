"""`tracking.*` and `eval.*`: what a run reports, and where."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems
from resilient_slurm.config.harness import HarnessConfig

TRACKING_MODES = ("offline", "online", "disabled")


@dataclass
class TrackingConfig:
    mode: str = "offline"
    """offline: wandb writes under the run directory and nothing leaves the machine (upload later
    with `wandb sync`); online; disabled. WANDB_MODE can only make it more private, never less."""
    project: str | None = None
    """wandb project; null: the run's experiment name."""
    entity: str | None = None
    """wandb entity (user or team); null: the logged-in user's default."""
    tags: list[str] = field(default_factory=list)
    """wandb tags of the run."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.mode in TRACKING_MODES,
               f"tracking.mode: {self.mode!r} unknown; use one of {', '.join(TRACKING_MODES)}")
        return p


@dataclass
class EvalConfig:
    every_steps: int = 0
    """Evaluate on the held-out split every N steps and at the last step (0 = off)."""
    task_samples: int = 128
    """Validation samples (the first of data.val_samples, which the validation loss covers) that the
    task metrics judge; for the built-in exact match, each response is decoded greedily (0 = none)."""
    predictions: int = 8
    """Rows (prompt, target, prediction) in each evaluation's table of sample predictions."""
    harness: HarnessConfig = field(default_factory=HarnessConfig)

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.every_steps >= 0, f"eval.every_steps: {self.every_steps}; set it >= 0 (0 = off)")
        p.need(self.task_samples >= 0 and self.predictions >= 0,
               "eval.task_samples: task_samples and predictions must be >= 0; raise them")
        p.extend_new(self.harness.problems())
        return p
