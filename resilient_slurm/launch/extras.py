"""The optional packages a run's config asks for, checked at launch: a run that needs an extra
that is not installed is refused in one line naming it, before anything is queued or trained.

    eval.harness.tasks        lm-eval          pip install 'resilient-slurm[eval]'
    tracking.backend=mlflow   mlflow-skinny    pip install 'resilient-slurm[mlflow]' (tracking.package_problem)
    checkpoint.cold.url=s3:// s3fs             pip install 'resilient-slurm[s3]'
    cluster.replica_ft=true   torchft          pip install 'resilient-slurm[replica]'

wandb, the default tracker, is a dependency; a run without it trains untracked (tracking.open_tracker).
"""

from __future__ import annotations

import importlib.util

from resilient_slurm.config import Config
from resilient_slurm.tracking import package_problem


def extra_problems(cfg: Config) -> list[str]:
    """One line per extra the config needs and this Python does not have."""
    problems = []
    if cfg.eval.harness.tasks and not installed("lm_eval"):
        problems.append(f"eval.harness.tasks: benchmarks ({', '.join(cfg.eval.harness.tasks)}) need lm-eval, which "
                        f"is not installed; pip install 'resilient-slurm[eval]', or leave eval.harness.tasks empty")
    if (tracking := package_problem(cfg)) is not None:
        problems.append(tracking)
    if cfg.checkpoint.cold.url.startswith("s3://") and not installed("s3fs"):
        problems.append(f"checkpoint.cold.url: {cfg.checkpoint.cold.url} needs s3fs, which is not installed; "
                        f"pip install 'resilient-slurm[s3]'")
    if cfg.cluster.replica_ft and not installed("torchft"):
        problems.append("cluster.replica_ft: replica groups need torchft, which is not installed; pip install "
                        "'resilient-slurm[replica]', or set cluster.replica_ft=false")
    return problems


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
        return False
