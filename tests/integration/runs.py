"""Launching real training runs from tests, watching them, and comparing their final states."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from resilient_slurm.ledger import Event, read_events

REPO = Path(__file__).resolve().parents[2]

TOKENIZED = Path(tempfile.gettempdir()) / f"resilient-slurm-tests-tokenized-{os.getuid()}"
"""One tokenized-data cache for every run the tests launch: its entries are keyed by the data, the
tokenizer and the settings, and processes share it safely (data/chat/cache.py), where each test's
new run root would otherwise tokenize the same tiny chat set again (a second or two a launch)."""

# The tiny_sft recipe shrunk further so a 200-step run takes seconds on 2 cores.
SMALL = [
    "+experiment=tiny_sft", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
    "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64", "data.global_batch_size=4",
    "data.micro_batch_size=2", "optim.warmup_steps=10", "train.log_every_steps=50", "train.max_steps=200",
    "checkpoint.every_steps=25", "eval.every_steps=0", f"data.cache_dir={TOKENIZED}",
]

# SMALL cut to 60 steps with a checkpoint every 10, for the tests that need only a few checkpoints
# and interrupts (tests/slurm keeps SMALL's own steps), untracked where tracking is not under test.
SHORT_STEPS, SHORT_EVERY = 60, 10
SHORT = [f"train.max_steps={SHORT_STEPS}", f"checkpoint.every_steps={SHORT_EVERY}", "tracking.mode=disabled"]


def launch(root: Path, name: str, *overrides: str, base: list[str] = SMALL) -> subprocess.Popen:
    """`python -m resilient_slurm.launch` in its own session, so a test can signal it like a scheduler would."""
    return subprocess.Popen(
        [sys.executable, "-m", "resilient_slurm.launch", *base, f"run.root={root}", f"run.name={name}", *overrides],
        cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def run_dir(root: Path, name: str) -> Path:
    return root / "tiny_sft" / name


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def last_step(rdir: Path) -> int:
    path = rdir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return steps[-1]


def wait_for_step(proc: subprocess.Popen, rdir: Path, step: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run exited with {proc.returncode} before step {step}:\n{proc.stdout.read()}")
        now = last_step(rdir)
        if now >= step:
            return now
        time.sleep(0.02)
    raise AssertionError(f"run did not reach step {step} in {timeout}s")


def interrupt(proc: subprocess.Popen, rdir: Path, at_step: int, signum: int) -> tuple[int, str]:
    wait_for_step(proc, rdir, at_step)
    if signum == signal.SIGKILL:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signum)
    return finish(proc)


def events(rdir: Path) -> list[Event[Any]]:
    return read_events(rdir / "events.jsonl")


def final_tensors(rdir: Path, step: int = 200, hot_root: Path | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint of `step` in the run's checkpoints/ (or in `hot_root`, a hot tier's directory)."""
    ckpt = (hot_root or rdir / "checkpoints") / f"step_{step:08d}"
    out: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update({f"{f.stem.split('-')[0]}/{k}": v for k, v in load_file(f).items()})
    return out


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizer/") for k in a), "no optimizer state to compare"
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), f"{k} differs"
