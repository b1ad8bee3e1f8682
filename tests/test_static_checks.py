"""The project's static gates, run with the tests so CI enforces them: the type checker over the
package, and the architecture rule that pure modules import nothing with side effects."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "resilient_slurm"

# Decisions, parsers, catalogs and layouts: they take data and return data.
PURE = ["monitor.py", "recovery.py", "naming.py", "goodput.py", "tracking/history.py", "checkpoint/layout.py",
        "checkpoint/manifest.py", "checkpoint/policy.py", "checkpoint/retention.py", "checkpoint/crc32.py",
        "checkpoint/costs.py", "checkpoint/deadline.py", "checkpoint/interval.py", "health/xid_catalog.py",
        "health/kernel_log.py", "health/verdict.py"]
SIDE_EFFECTS = {"subprocess", "socket", "signal", "threading", "shutil", "torch", "wandb", "submitit", "pynvml",
                "fcntl", "mmap", "requests", "urllib"}


def test_types():
    pytest.importorskip("mypy")
    done = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", str(PACKAGE)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_side_effecting_library(module):
    tree = ast.parse((PACKAGE / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & SIDE_EFFECTS, f"{module} imports {sorted(imported & SIDE_EFFECTS)}"
