"""Where a run's MLflow data lives, and reading it back with MLflow's own client (the sink's resume,
the report, the tests).

The store is `tracking.uri`, or by default the file store `<run_dir>/mlruns` (offline: plain files,
no server, no database). MLflow keeps its file store in maintenance mode and refuses to open one
unless MLFLOW_ALLOW_FILE_STORE=true, which `client` sets for this process; we keep it as the
default because it is append-only text that survives a SIGKILL and needs no file locks, which
SQLite does not get on many parallel file systems. `tracking.uri=sqlite:///...` works too.

MLflow picks its own run ids, so the one a run directory continues is recorded in
`<run_dir>/mlflow/run.json` with the store it lives in, and the run is also tagged with the run
directory's id (`RUN_TAG`). Every row the sink writes ends with the metric `step` (`STEP_KEY`):
the steps that metric holds are the rows the store holds whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_slurm.files import atomic_write
from resilient_slurm.rundir import RunDir

RUN_FILE = "run.json"
RUN_TAG = "resilient_slurm.run_id"
STEP_KEY = "step"


def store_uri(configured: str | None, run_dir: Path) -> str:
    """`tracking.uri`, or the file store inside the run directory."""
    return configured or str(RunDir(run_dir).mlruns.resolve())


def is_file_store(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite database (MLflow's default would
    be ./mlruns in whatever directory the job runs in); the store or the server decides otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()


def client(uri: str) -> Any:
    """An `MlflowClient` for `uri` (imports mlflow)."""
    if is_file_store(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def read_ids(run_dir: Path) -> dict[str, Any] | None:
    """{"tracking_uri", "run_id"} of the MLflow run this run directory continues, if it has one; the
    uri as configured (None: the store inside the run directory, wherever the directory is now)."""
    path = RunDir(run_dir).mlflow / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_ids(run_dir: Path, configured_uri: str | None, run_id: str) -> None:
    path = RunDir(run_dir).mlflow / RUN_FILE
    path.parent.mkdir(exist_ok=True)
    atomic_write(path, json.dumps({"tracking_uri": configured_uri, "run_id": run_id}))


def steps(mlflow_client: Any, run_id: str) -> list[int]:
    """The steps whose rows the store holds whole, in the order they were written."""
    return [m.step for m in mlflow_client.get_metric_history(run_id, STEP_KEY)]


@dataclass(frozen=True)
class StoredRun:
    """What the report says about a run's MLflow run."""

    uri: str
    run_id: str
    status: str | None = None
    steps: int = 0
    last_step: int | None = None
    error: str | None = None
    """Why the run could not be read (mlflow missing, the store unreadable)."""


def describe(run_dir: Path) -> StoredRun | None:
    """The run directory's MLflow run as its store holds it; None if it never had one. Never raises."""
    ids = read_ids(run_dir)
    if ids is None:
        return None
    uri, run_id = store_uri(ids["tracking_uri"], run_dir), ids["run_id"]
    try:
        c = client(uri)
        found = steps(c, run_id)
        return StoredRun(uri, run_id, c.get_run(run_id).info.status, len(found), max(found, default=None))
    except ImportError:
        return StoredRun(uri, run_id, error="mlflow is not installed: pip install 'resilient-slurm[mlflow]'")
    except Exception as e:  # noqa: BLE001 - a store that cannot be read must not stop the report
        first = (str(e).strip().splitlines() or [""])[0]
        return StoredRun(uri, run_id, error=f"cannot read it: {type(e).__name__}: {first}")
