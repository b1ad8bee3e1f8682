"""The memory tier's directories: where they are, their claim files, the room a node has, and the
epilog's cleanup, which removes claimed directories only (of one job, when asked)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

from resilient_slurm.checkpoint import memory_files
from resilient_slurm.checkpoint.memory_files import CLAIM, claim, clean, held_bytes, mem_available, root

MODULE = Path(memory_files.__file__)


def test_a_runs_tier_is_under_the_dir_with_the_node_for_percent_n():
    run_dir = Path("/x/experiments/exp/run-1")
    assert root(run_dir, "/dev/shm/rs", "n7") == Path("/dev/shm/rs/exp/run-1")
    assert root(run_dir, "/dev/shm/rs/%n", "n7") == Path("/dev/shm/rs/n7/exp/run-1")


def test_a_claim_names_the_run_and_its_job_and_survives_a_restart(tmp_path, monkeypatch):
    tier = tmp_path / "exp" / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    claim(tier, Path("/runs/exp/run"))
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # a later job of the same run keeps the first claim
    claim(tier, Path("/runs/exp/run"))
    assert json.loads((tier / CLAIM).read_text()) == {"run_dir": "/runs/exp/run", "job_id": "41"}
    (tier / "step_00000001").mkdir()
    (tier / "step_00000001" / "model.safetensors").write_bytes(b"x" * 1000)
    assert held_bytes(tier) == 1000 + (tier / CLAIM).stat().st_size


def test_clean_removes_claimed_tiers_only_and_those_of_one_job_when_asked(tmp_path, monkeypatch):
    base = tmp_path / "shm"
    for job, name in (("1", "a"), ("1", "b"), ("2", "c")):
        monkeypatch.setenv("SLURM_JOB_ID", job)
        claim(base / "exp" / name, Path(f"/runs/exp/{name}"))
    (base / "exp" / "unclaimed").mkdir()  # someone else's directory
    assert clean(str(base), job_id="2") == [base / "exp" / "c"]
    assert sorted(p.name for p in (base / "exp").iterdir()) == ["a", "b", "unclaimed"]
    done = subprocess.run([sys.executable, "-I", str(MODULE), "clean", str(base)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.count("removed ") == 2, done.stderr
    assert [p.name for p in (base / "exp").iterdir()] == ["unclaimed"]


def test_clean_expands_the_node_name(tmp_path):
    claim(tmp_path / "n3" / "exp" / "run", Path("/runs/exp/run"))
    assert clean(str(tmp_path / "%n"), node="n3") == [tmp_path / "n3" / "exp" / "run"]


def test_mem_available_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemFree:  100 kB\nMemAvailable:   21000000 kB\n")
    assert mem_available(str(meminfo)) == 21000000 * 1024
    assert mem_available() > 0  # this machine's


def test_the_epilog_module_imports_the_standard_library_only():
    tree = ast.parse(MODULE.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__"} <= sys.stdlib_module_names, names - sys.stdlib_module_names
