"""lm-evaluation-harness on one Hugging Face model directory, in this process: the scores, flat.

lm-eval (`pip install resilient-slurm[eval]`) is imported here only, lazily: training never needs
it. Nothing is downloaded: the datasets and hub libraries are told they are offline, so a task
whose data is not local fails at once with its name instead of hanging on a cluster without
internet. lm-eval's own task registry (a few thousand YAMLs) is indexed only when a task is not
found among the local ones, which saves seconds per evaluation.

Scores are `{"<task>/<metric>": value}` (`tiny_mmlu/acc`, `tiny_gsm8k/exact_match,strict-match`);
standard errors and sample counts are left out (they are in lm-eval's own results file, kept beside the export).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class HarnessError(RuntimeError):
    """lm-eval is missing, or a task cannot run; one line naming it and the fix."""


@dataclass(frozen=True)
class HarnessSettings:
    tasks: list[str]
    include_paths: list[str]
    num_fewshot: int | None = None
    limit: int | None = None
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    chat_template: bool = False


def run_harness(hf_dir: Path, s: HarnessSettings, results_json: Path | None = None) -> dict[str, float]:
    """Evaluate the model in `hf_dir` on `s.tasks`; lm-eval's whole results go to `results_json`."""
    os.environ.update(OFFLINE_ENV)
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise HarnessError("lm-eval is not installed; pip install 'resilient-slurm[eval]' (or lm-eval) where the "
                           "evaluation runs") from None
    manager = TaskManager(include_path=s.include_paths, include_defaults=False)
    if not set(s.tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=s.include_paths)
        unknown = sorted(set(s.tasks) - set(manager.all_tasks))
        if unknown:
            raise HarnessError(f"eval.harness.tasks: {', '.join(unknown)} is no lm-eval task and none of the local "
                               f"ones; use a task name of lm-eval, tiny_mmlu, tiny_gsm8k, or one of "
                               f"eval.harness.include_path")
    out = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(hf_dir), "dtype": s.dtype}, tasks=list(s.tasks),
        num_fewshot=s.num_fewshot, limit=s.limit, batch_size=s.batch_size, device=s.device, task_manager=manager,
        apply_chat_template=s.chat_template, log_samples=False, bootstrap_iters=0,
    )
    if out is None:
        raise HarnessError("lm-eval returned no results")
    results: dict[str, Any] = dict(out["results"])
    if results_json is not None:
        results_json.write_text(json.dumps({"results": results, "versions": out.get("versions")}, indent=1,
                                           default=str) + "\n")
    return scores(results)


def scores(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's `results` → `{"task/metric[,filter]": value}`; `,none` (no filter) is dropped."""
    flat: dict[str, float] = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            if "_stderr" in key or key == "sample_len" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric = key[: -len(",none")] if key.endswith(",none") else key
            flat[f"{task}/{metric}"] = float(value)
    return flat
