"""lm-evaluation-harness itself (the real package, offline) on the shipped tiny tasks, and the
flattening of its results."""

from pathlib import Path

import pytest
import yaml

from resilient_slurm.evaluate.harness import HarnessError, HarnessSettings, run_harness, scores
from resilient_slurm.evaluate.tasks import SHIPPED, include_paths, localized
from tests.hf_model import make_hf_model

pytest.importorskip("lm_eval")


def test_results_flatten_to_task_metric_keys_without_stderrs():
    results = {"tiny_mmlu": {"alias": "tiny_mmlu", "acc,none": 0.25, "acc_stderr,none": 0.1, "sample_len": 12},
               "tiny_gsm8k": {"exact_match,strict-match": 0.0, "exact_match_stderr,strict-match": 0.0,
                              "exact_match,flexible-extract": 0.5}}
    assert scores(results) == {"tiny_mmlu/acc": 0.25, "tiny_gsm8k/exact_match,strict-match": 0.0,
                               "tiny_gsm8k/exact_match,flexible-extract": 0.5}


def test_the_shipped_tasks_are_localized_with_absolute_data_files(tmp_path):
    out = localized(tmp_path / "tasks")
    for task in SHIPPED:
        config = yaml.safe_load((out / f"{task}.yaml").read_text())
        data = Path(config["dataset_kwargs"]["data_files"]["test"])
        assert config["task"] == task and config["dataset_path"] == "json"
        assert data.is_absolute() and data.is_file() and len(data.read_text().splitlines()) >= 8
    with pytest.raises(FileNotFoundError, match="eval.harness.include_path"):
        include_paths(tmp_path, str(tmp_path / "missing"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("m") / "model")


def test_lm_eval_scores_a_model_directory_on_both_shipped_tasks(model_dir, tmp_path):
    got = run_harness(model_dir, HarnessSettings(list(SHIPPED), include_paths(tmp_path, ""), limit=3, batch_size=4),
                      tmp_path / "results.json")
    assert set(got) == {"tiny_mmlu/acc", "tiny_gsm8k/exact_match,strict-match", "tiny_gsm8k/exact_match,flexible-extract"}
    assert all(0.0 <= v <= 1.0 for v in got.values())
    assert got["tiny_mmlu/acc"] in (0.0, 1 / 3, 2 / 3, 1.0)  # 3 questions scored
    assert "tiny_mmlu" in (tmp_path / "results.json").read_text()


@pytest.mark.slow  # indexing lm-eval's own few thousand task YAMLs takes minutes on 2 cores
def test_a_task_that_is_nowhere_is_named(model_dir, tmp_path):
    with pytest.raises(HarnessError, match="eval.harness.tasks: no_such_benchmark is no lm-eval task"):
        run_harness(model_dir, HarnessSettings(["no_such_benchmark"], include_paths(tmp_path, "")))
