"""The checkpoint package's decisions are pure: they take data (and `now`) and return data."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "resilient_slurm" / "checkpoint"
PURE = ["crc32.py", "costs.py", "deadline.py", "interval.py", "layout.py", "manifest.py", "policy.py", "retention.py"]
SIDE_EFFECTS = {"os", "time", "subprocess", "socket", "signal", "threading", "shutil", "torch", "fsspec", "fcntl",
                "mmap", "zlib", "concurrent"}


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_side_effecting_library(module):
    imported = set()
    for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & SIDE_EFFECTS, f"{module} imports {sorted(imported & SIDE_EFFECTS)}"
