"""`run.*`: where a run lives and what it is called."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems, safe_name


@dataclass
class RunConfig:
    root: str = "experiments"
    """Experiments root: runs live in `<root>/<experiment>/<name>/`."""
    experiment: str = "default"
    """Experiment name (set by the `+experiment=` file)."""
    name: str | None = None
    """Run name; generated from the config when null. Launching an existing name resumes it."""
    fork: bool = False
    """Launching an existing name with a changed config starts a new run `<name>-forkN` whose record
    names its parent, instead of refusing (the fork starts from scratch, not from the parent's weights)."""
    baseline: str | None = None
    """Name of the run (same experiment) this one is an ablation of: sets the wandb group
    `ablation-<component>-<baseline>-vs-<variant>` from the keys that differ."""
    require: list[str] = field(default_factory=list)
    """Keys a recipe cannot run without (e.g. model.pretrained, data.path): each must be set."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.name is None or safe_name(self.name),
               f"run.name: {self.name!r} is not a plain name; use letters, digits, '.', '_', '-'")
        p.need(safe_name(self.experiment),
               f"run.experiment: {self.experiment!r} is not a plain name; use letters, digits, '.', '_', '-'")
        p.need(self.baseline is None or safe_name(self.baseline),
               f"run.baseline: {self.baseline!r} is not a plain name; use the baseline run's name")
        return p
