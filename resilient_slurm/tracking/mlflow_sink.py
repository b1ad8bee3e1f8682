"""The MLflow sink: one MLflow run per run directory, continued by every restart and requeue.

Opening finds the run (the id in `<run_dir>/mlflow/run.json`, else the run tagged with the run
directory's id: a process killed between creating the run and recording its id must not leave a
second one), or creates it in the experiment `tracking.project` (default: the run's experiment).
It then logs, once per process:
- params: the flattened config. MLflow params are write-once, so a key whose value changed on a
  relaunch (a placement key, a search's allowed change) keeps its first value there; the
  `config.yaml` artifact, replaced by every process, is the config the run continues with;
- tags: experiment, run name, group (ablation or sweep), `tracking.tags`, and at the first send
  the git commit and branch of the newest attempt in record.jsonl;
- artifacts: `config.yaml`, and every saved diff under `git/`.

Rows are written synchronously, under the dashboard names wandb uses, each point dated by when its
step ran; a `Table` becomes the JSON artifact `<key>/step_<step>.json` (`{"columns", "data"}`, as
pandas reads it with orient="split"), written before the row's metrics. Each row ends with the
metric `step`, so the steps that metric holds are rows the store holds whole: they are `on_disk`,
read back from the store itself (a file store, SQLite or a server alike).

MLflow cannot add to a point it holds: when the ledger events seen at close repeat the step of the
last row sent and a count already logged there (two saves), the sink logs the count's new total at
that step, and MLflow shows that later point as the step's value. Status: RUNNING while a process
runs, SCHEDULED after a stop that will be resumed, FINISHED, FAILED (a SIGKILLed process leaves it
RUNNING, and the next one carries on).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from resilient_slurm.config import Config, flatten
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.files import stamp_seconds
from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.record import GIT_DIR, read_record
from resilient_slurm.tracking import mlflow_store
from resilient_slurm.tracking.base import DASHBOARD_KEYS, Table, run_group
from resilient_slurm.tracking.history import BENCH_PREFIX, BENCH_STEP, Row

_PARAM_MAX_CHARS = 6000  # MLflow's limit on a param value
_STATUS: dict[int, str] = {ExitCode.DONE: "FINISHED", ExitCode.RESUME: "SCHEDULED"}


class MlflowSink:
    name = "mlflow"

    def __init__(self, client: Any, run_id: str, run_dir: Path) -> None:
        self.client = client
        self.run_id = run_id
        self.run_dir = run_dir
        self.code_logged = False
        self.last_step: int | None = None
        self.last_counts: dict[str, float] = {}
        self.last_tables: dict[str, Table] = {}
        """What the last row sent holds, for a row that adds to it."""

    @classmethod
    def open(cls, cfg: Config, run_dir: Path, meta: dict[str, Any]) -> tuple[MlflowSink, int]:
        """The sink and the highest step whose row its store holds."""
        from mlflow.entities import Param, RunTag

        uri = mlflow_store.store_uri(cfg.tracking.uri, run_dir)
        client = mlflow_store.client(uri)
        tags = {"experiment": cfg.run.experiment, "run": run_dir.name, mlflow_store.RUN_TAG: meta["run_id"],
                **{t: "" for t in cfg.tracking.tags}}
        group = run_group(cfg, meta)
        if group:
            tags["group"] = group
        run_id = _find_or_create(client, cfg.tracking.project or cfg.run.experiment, run_dir, meta["run_id"], tags)
        mlflow_store.write_ids(run_dir, cfg.tracking.uri, run_id)
        client.update_run(run_id, status="RUNNING")
        logged = client.get_run(run_id).data.params
        params = [Param(k, _param(v)) for k, v in flatten(cfg).items() if k not in logged]
        client.log_batch(run_id, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
        if RunDir(run_dir).config.is_file():
            client.log_artifact(run_id, str(RunDir(run_dir).config))
        return cls(client, run_id, run_dir), max(mlflow_store.steps(client, run_id), default=0)

    def send(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric

        if not self.code_logged:
            self._log_code()
        metrics = []
        for step, values in rows:
            again = step == self.last_step
            if not again:
                self.last_step, self.last_counts, self.last_tables = step, {}, {}
            stamp = _millis(values.get("time"))
            for key, value in values.items():
                name = DASHBOARD_KEYS.get(key, key)
                if isinstance(value, Table):
                    self._log_table(name, step, value)
                elif key.startswith(BENCH_PREFIX):
                    # Benchmark scores at their checkpoint's step: MLflow takes a step that went by.
                    if key != BENCH_STEP:
                        metrics.append(Metric(name, float(value), stamp, int(values[BENCH_STEP])))
                elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "time"):
                    total = self.last_counts.get(name, 0.0) + value if again else float(value)
                    self.last_counts[name] = total
                    metrics.append(Metric(name, total, stamp, step))
            if not again:
                metrics.append(Metric(mlflow_store.STEP_KEY, float(step), stamp, step))
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, exit_code: int) -> None:
        if not self.code_logged:
            self._log_code()
        status = _STATUS.get(exit_code, "FAILED")
        if status == "SCHEDULED":
            self.client.update_run(self.run_id, status=status)
        else:
            self.client.set_terminated(self.run_id, status)

    def _log_table(self, name: str, step: int, table: Table) -> None:
        if name in self.last_tables:
            table = Table(table.columns, self.last_tables[name].rows + table.rows)
        self.last_tables[name] = table
        self.client.log_text(self.run_id, json.dumps({"columns": table.columns, "data": table.rows}, default=str),
                             f"{name}/step_{step:08d}.json")

    def _log_code(self) -> None:
        """The newest attempt's git state (record.jsonl is written after the tracker opens)."""
        self.code_logged = True
        attempts = [r for r in read_record(self.run_dir) if r.get("kind") == "attempt"]
        git = (attempts[-1].get("git") or {}) if attempts else {}
        if git.get("commit"):
            self.client.set_tag(self.run_id, "mlflow.source.git.commit", git["commit"])
        if git.get("branch"):
            self.client.set_tag(self.run_id, "mlflow.source.git.branch", git["branch"])
        for diff in sorted(RunDir(self.run_dir).git.glob("*.diff")):
            self.client.log_artifact(self.run_id, str(diff), GIT_DIR)


def _find_or_create(client: Any, experiment: str, run_dir: Path, run_dir_id: str, tags: dict[str, str]) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is None:
        try:
            experiment_id = client.create_experiment(experiment, mlflow_store.artifact_location(client.tracking_uri))
        except MlflowException:  # another run created it meanwhile (a search's trials start together)
            experiment_id = client.get_experiment_by_name(experiment).experiment_id
    else:
        experiment_id = found.experiment_id
    known = mlflow_store.read_ids(run_dir)
    if known:
        try:
            run = client.get_run(known["run_id"])
            if run.info.lifecycle_stage == "active" and run.data.tags.get(mlflow_store.RUN_TAG) == run_dir_id:
                return str(run.info.run_id)
        except MlflowException:
            pass  # not in this store (tracking.uri changed since): find or create it there
    runs = client.search_runs([experiment_id], f"tags.`{mlflow_store.RUN_TAG}` = '{run_dir_id}'", max_results=1)
    if runs:
        return str(runs[0].info.run_id)
    return str(client.create_run(experiment_id, run_name=run_dir.name, tags=tags).info.run_id)


def _param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:_PARAM_MAX_CHARS]


def _millis(stamp: Any) -> int:
    """A UTC `time` as metrics.jsonl writes it, in epoch milliseconds; now when there is none."""
    if isinstance(stamp, str):
        try:
            return int(stamp_seconds(stamp) * 1000)
        except ValueError:
            pass
    return int(time.time() * 1000)
