"""The tracker seam: what the training loop calls, whatever (if anything) records it.

Only rank 0 tracks; every other rank, and a run with tracking disabled, gets the `NullTracker`,
so call sites stay unconditional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from resilient_slurm.config import Config

# metrics.jsonl's keys as the dashboards show them (wandb and MLflow alike); keys not listed keep their name.
DASHBOARD_KEYS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "epoch": "train/epoch",
    "tokens": "train/tokens", "tokens_per_s": "perf/tokens_per_s", "samples_per_s": "perf/samples_per_s",
    "step_seconds": "perf/step_seconds", "eval_seconds": "perf/eval_seconds", "val_loss": "val/loss",
    "exact_match": "val/exact_match", "gpu_util": "gpu/utilization", "gpu_mem_gb": "gpu/memory_gb",
    "gpu_mem_peak_gb": "gpu/memory_peak_gb",
}


@dataclass(frozen=True)
class Table:
    """A small table (sample predictions, ledger events) logged at a step."""

    columns: list[str]
    rows: list[list[Any]]


def run_group(cfg: Config, meta: dict[str, Any]) -> str | None:
    """The group a run is shown in: its ablation group, or a search's study for its trials."""
    return meta.get("ablation", {}).get("group") or (f"sweep-{cfg.sweep.name}" if cfg.sweep.name else None)


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, Any]) -> None:
        """Values (numbers, or `Table`s) of training step `step`; several calls for one step merge."""

    def commit(self, step: int) -> None:
        """Every step up to `step` is final: a checkpoint of `step` is committed, or the run finished."""

    def rewind(self, step: int) -> None:
        """The run went back to `step` (a rollback): drop the uncommitted rows after it."""

    def close(self, exit_code: int) -> None:
        """End this process's part of the run; steps logged after the last commit are dropped."""


class NullTracker:
    def log(self, step: int, values: dict[str, Any]) -> None:
        pass

    def commit(self, step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass

    def close(self, exit_code: int) -> None:
        pass
