"""Which tracker a rank gets: offline by default, WANDB_MODE can only make it more private."""

import logging
import sys

import pytest

from resilient_slurm.config import Config
from resilient_slurm.tracking import NullTracker, effective_mode, open_tracker, package_problem


@pytest.mark.parametrize(
    "configured, env, expected",
    [
        ("offline", None, "offline"),
        ("offline", "", "offline"),
        ("offline", "disabled", "disabled"),
        ("offline", "online", "offline"),  # a stray WANDB_MODE=online uploads nothing
        ("online", "offline", "offline"),
        ("online", "dryrun", "offline"),
        ("online", "run", "online"),
        ("online", None, "online"),
        ("disabled", "online", "disabled"),
        ("offline", "bogus", "offline"),
        ("online", " Disabled ", "disabled"),
    ],
)
def test_effective_mode(configured, env, expected):
    assert effective_mode(configured, env) == expected


@pytest.mark.parametrize("rank, mode, env", [(1, "offline", "offline"), (0, "disabled", "offline"), (0, "offline", "disabled")])
def test_null_tracker_without_importing_wandb(tmp_path, monkeypatch, rank, mode, env):
    monkeypatch.setenv("WANDB_MODE", env)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    cfg = Config()
    cfg.tracking.mode = mode
    tracker = open_tracker(cfg, tmp_path, rank)
    assert isinstance(tracker, NullTracker) and "wandb" not in sys.modules
    tracker.log(1, {"loss": 1.0})
    tracker.commit(1)
    tracker.close(0)


def test_a_tracker_that_cannot_start_leaves_training_alone(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(logging.getLogger("resilient_slurm"), "propagate", True)
    # No run.json: the wandb run id is missing, as if the run directory were broken.
    assert isinstance(open_tracker(Config(), tmp_path, 0), NullTracker)
    assert "tracking is off for this attempt" in caplog.text


@pytest.mark.parametrize("backend, mode, rank", [("none", "offline", 0), ("mlflow", "disabled", 0), ("mlflow", "offline", 1)])
def test_no_tracker_imports_no_backend(tmp_path, monkeypatch, backend, mode, rank):
    for name in ("wandb", "mlflow"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    cfg = Config()
    cfg.tracking.backend, cfg.tracking.mode = backend, mode
    tracker = open_tracker(cfg, tmp_path, rank)
    assert isinstance(tracker, NullTracker) and "wandb" not in sys.modules and "mlflow" not in sys.modules
    assert package_problem(cfg) is None or backend != "none"


@pytest.mark.parametrize("backend, install", [("wandb", "pip install wandb"),
                                              ("mlflow", "pip install 'resilient-slurm[mlflow]'")])
def test_a_missing_package_is_one_line_and_the_run_goes_on_untracked(tmp_path, monkeypatch, caplog, backend, install):
    """The package is made unimportable (as if not installed) by None entries in sys.modules, its
    submodules' too (another test may have imported them). wandb, the default and a dependency, is
    no reason to refuse a launch (item 17 of issue 27); MLflow, an extra the run asked for, is."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(logging.getLogger("resilient_slurm"), "propagate", True)
    for name in [m for m in sys.modules if m.startswith(f"{backend}.")] + [backend]:
        monkeypatch.setitem(sys.modules, name, None)
    (tmp_path / "run.json").write_text('{"run_id": "x1"}')
    cfg = Config()
    cfg.tracking.backend = backend
    assert isinstance(open_tracker(cfg, tmp_path, 0), NullTracker)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"{backend} (offline) did not start: {backend} is not installed ({install}); tracking is off "
                    "for this attempt, metrics.jsonl has every step")
    assert package_problem(cfg) == (None if backend == "wandb" else
                                    f"tracking.backend: mlflow is not installed; {install}, or set "
                                    "tracking.backend=none (metrics.jsonl still has every step)")
    cfg.tracking.mode = "disabled"
    assert package_problem(cfg) is None


def test_installed_packages_are_no_problem():
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    for backend in ("wandb", "mlflow", "none"):
        cfg = Config()
        cfg.tracking.backend = backend
        assert package_problem(cfg) is None
