"""The console scripts in pyproject point at callables that exist; pure modules stay pure."""

import ast
import importlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def test_console_scripts_resolve():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"resilient-report", "resilient-compare"} <= scripts.keys()
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))


SIDE_EFFECTS = {"subprocess", "torch", "wandb", "matplotlib", "socket", "signal", "requests"}


@pytest.mark.parametrize("module", ["analysis/goodput", "launch/naming", "tracking/history", "tracking/base"])
def test_pure_modules_import_no_side_effecting_library(module):
    tree = ast.parse((ROOT / "resilient_slurm" / f"{module}.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & SIDE_EFFECTS
