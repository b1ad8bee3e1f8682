"""The README's quick start in a fresh virtual environment (issue 27, item 17): `pip install
torch==2.13.0`, then `pip install -e .` with nothing else, then the launch. A venv made with
`--system-site-packages` would see this machine's test packages and prove nothing, so this one is
bare: every dependency comes from the package index pip is configured with (pip's own cache makes a
second install faster; nothing else is cached, so the install is tested every time).

Then the same venv without wandb, the default tracker: the launch still trains, untracked, and says
so in one line. The install takes about 2.5 minutes here (torch's wheel alone about 1): the figures
are printed for CI's log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The quick start, shortened: 6 steps with an evaluation at the last, then the export.
SHORT = ["train.max_steps=6", "eval.every_steps=6"]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def test_a_fresh_venv_installs_the_project_and_runs_the_quick_start(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    pip, python = [str(venv / "bin" / "python"), "-m", "pip"], str(venv / "bin" / "python")
    # Run from outside the checkout, with nothing of this process's environment that points into it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "WANDB_MODE")}
    assert run([python, "-c", "import importlib.util as u; print(u.find_spec('torch'))"], env=env).stdout == "None\n"
    start = time.monotonic()
    run([*pip, "install", "torch==2.13.0"], env=env)
    torch_s = time.monotonic() - start
    run([*pip, "install", "-e", str(REPO)], env=env)
    install_s = time.monotonic() - start
    print(f"fresh install: torch {torch_s:.0f} s, the project {install_s - torch_s:.0f} s")

    root = tmp_path / "experiments"
    done = run([python, "-m", "resilient_slurm.launch", "+experiment=tiny_sft", f"run.root={root}", *SHORT],
               cwd=tmp_path, env=env)
    out = done.stdout + done.stderr
    (rdir,) = (root / "tiny_sft").iterdir()
    assert "finished at step 6" in out and (rdir / "hf" / "config.json").is_file(), out
    assert any((rdir / "wandb").glob("offline-run-*")), "the default tracker (wandb, offline) did not run"
    assert "not installed" not in out and "Traceback" not in out, out
    assert "wandb" not in out, out  # wandb's own banner lines (offline mode, where, `wandb leet`) stay in the log

    run([*pip, "uninstall", "-y", "wandb"], env=env)
    done = run([python, "-m", "resilient_slurm.launch", "+experiment=tiny_sft", f"run.root={root}", "run.name=bare",
                *SHORT], cwd=tmp_path, env=env)
    out = done.stdout + done.stderr
    assert "finished at step 6" in out, out
    said = [line for line in out.splitlines() if "wandb" in line]
    assert len(said) == 1 and said[0].endswith("wandb (offline) did not start: wandb is not installed (pip install "
                                               "wandb); tracking is off for this attempt, metrics.jsonl has every step"), said
