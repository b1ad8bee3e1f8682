"""Where each file and folder of a run directory is: the format's one spelling of every name. [pure]"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resilient_slurm.ledger import LEDGER_FILE


@dataclass(frozen=True)
class RunDir:
    """`<root>/<experiment>/<run>/`: one property per file or folder of it."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def experiment(self) -> str:
        return self.path.parent.name

    @property
    def config(self) -> Path:
        """config.yaml: the resolved config the run uses (rewritten when only placement keys change)."""
        return self.path / "config.yaml"

    @property
    def overrides(self) -> Path:
        """overrides.yaml: the command-line overrides of the first launch."""
        return self.path / "overrides.yaml"

    @property
    def meta(self) -> Path:
        """run.json: run id, name, creation time, config hash; a fork's parent, an ablation's group."""
        return self.path / "run.json"

    @property
    def record(self) -> Path:
        """record.jsonl: every launch and attempt (job, nodes, versions, git state)."""
        return self.path / "record.jsonl"

    @property
    def events(self) -> Path:
        """events.jsonl: the ledger, every save, signal, fault, restart and resume."""
        return self.path / LEDGER_FILE

    @property
    def metrics(self) -> Path:
        """metrics.jsonl: one line per step of the surviving timeline."""
        return self.path / "metrics.jsonl"

    @property
    def benchmarks(self) -> Path:
        """benchmarks.jsonl: each evaluated checkpoint's benchmark scores, at its own step (rundir/benchmarks.py)."""
        return self.path / "benchmarks.jsonl"

    @property
    def evals(self) -> Path:
        """evals/: one work directory per benchmark evaluation (`step_N/`: its log, lm-eval's results)."""
        return self.path / "evals"

    @property
    def data_record(self) -> Path:
        """data.json: the data's fingerprint at the first start; later starts must match it."""
        return self.path / "data.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def logs(self) -> Path:
        """logs/: rank-N.log and the watchdog's stack dumps."""
        return self.path / "logs"

    @property
    def git(self) -> Path:
        """git/: each distinct diff of the code the run ran, saved once."""
        return self.path / "git"

    @property
    def hf(self) -> Path:
        """hf/: the finished model (a Hugging Face directory, or a PEFT adapter)."""
        return self.path / "hf"

    @property
    def slurm(self) -> Path:
        """slurm/: submitit's job files and logs, and the per-attempt decision marks."""
        return self.path / "slurm"

    @property
    def wandb(self) -> Path:
        return self.path / "wandb"

    @property
    def mlruns(self) -> Path:
        """mlruns/: the MLflow file store of a run with tracking.backend=mlflow and no tracking.uri."""
        return self.path / "mlruns"

    @property
    def mlflow(self) -> Path:
        """mlflow/: the id of the MLflow run this directory continues, and what was sent to it."""
        return self.path / "mlflow"

    def exists(self) -> bool:
        """A run directory is one once its config is written."""
        return self.config.exists()
