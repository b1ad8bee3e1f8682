"""`tracking.*` and `eval.*`: what a run reports, and where."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems
from resilient_slurm.config.harness import HarnessConfig

TRACKING_MODES = ("offline", "online", "disabled")
TRACKING_BACKENDS = ("wandb", "mlflow", "none")


@dataclass
class TrackingConfig:
    backend: str = "wandb"
    """wandb, mlflow or none (metrics.jsonl only); each needs its extra: pip install 'resilient-slurm[mlflow]'."""
    mode: str = "offline"
    """offline: nothing leaves the machine (wandb writes under the run directory, upload later with
    `wandb sync`; MLflow writes to a local store, never a server); online (wandb uploads live, MLflow
    sends to the server at tracking.uri); disabled. WANDB_MODE can only make wandb more private."""
    uri: str | None = None
    """MLflow's tracking URI: an absolute path, file:, sqlite:, or a server (http://host:5000, with
    mode=online); null: the file store <run_dir>/mlruns. MLFLOW_TRACKING_URI is not read."""
    project: str | None = None
    """wandb project or MLflow experiment; null: the run's experiment name."""
    entity: str | None = None
    """wandb entity (user or team); null: the logged-in user's default."""
    tags: list[str] = field(default_factory=list)
    """Tags of the run (MLflow: tags with empty values)."""

    def problems(self) -> list[str]:
        p = Problems()
        uri = self.uri or ""
        server = "://" in uri and not uri.startswith(("file:", "sqlite:"))
        mlflow = self.backend == "mlflow"
        p.need(self.mode in TRACKING_MODES,
               f"tracking.mode: {self.mode!r} unknown; use one of {', '.join(TRACKING_MODES)}")
        p.need(self.backend in TRACKING_BACKENDS,
               f"tracking.backend: {self.backend!r} unknown; use one of {', '.join(TRACKING_BACKENDS)}")
        p.need(self.uri is None or mlflow,
               "tracking.uri: only tracking.backend=mlflow uses it; set tracking.backend=mlflow or remove tracking.uri")
        p.need(not uri or server or uri.startswith(("/", "file:", "sqlite:")),
               f"tracking.uri: {uri!r} is a relative path; give an absolute path or a URI")
        p.need(not (mlflow and self.mode == "offline" and server),
               f"tracking.uri: {uri} is a server, which tracking.mode=offline never sends to; set tracking.mode=online")
        p.need(not (mlflow and self.mode == "online" and not uri),
               "tracking.uri: tracking.mode=online sends to a server; set tracking.uri=http://HOST:PORT (or mode=offline)")
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
