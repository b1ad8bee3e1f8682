"""`slurm_cluster`: the running tools/slurm_sandbox cluster, reset before each test.

Bring it up first (as root): `tools/slurm_sandbox up`. Without it these tests skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

SANDBOX = Path(__file__).resolve().parents[2] / "tools" / "slurm_sandbox"
DEFAULT_DIR = "/tmp/resilient_slurm_sandbox"  # the sandbox's own default
COMMAND_TIMEOUT_S = 30.0
T = TypeVar("T")


@dataclass
class SlurmCluster:
    state_dir: Path
    submitted: list[str] = field(default_factory=list)

    def run(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}"
        return done.stdout

    def sbatch(self, script: Path, *options: str) -> str:
        # --time bounds a test job that hangs: the cluster kills it even if the test never does.
        job_id = self.run("sbatch", "--parsable", "--time=2", *options, str(script)).strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict; values that contain spaces are cut at the first one."""
        fields = {}
        for item in self.run("scontrol", "show", "job", "--oneliner", job_id).split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def sandbox(command: str, state_dir: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SANDBOX), command, "--dir", str(state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def slurm_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    state_dir = Path(os.environ.get("RESILIENT_SLURM_SANDBOX", DEFAULT_DIR))
    status = sandbox("status", state_dir, COMMAND_TIMEOUT_S)
    if status.returncode != 0:
        verdict = (status.stdout.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"Slurm sandbox not usable: {verdict}")
    monkeypatch.setenv("SLURM_CONF", str(state_dir / "slurm.conf"))
    # Generous: a leftover job that ignores SIGTERM takes KillWait (10 s) to die.
    reset = sandbox("reset-nodes", state_dir, 60)
    assert reset.returncode == 0, f"reset-nodes failed: {reset.stderr.strip()}"
    cluster = SlurmCluster(state_dir)
    yield cluster
    if cluster.submitted:
        subprocess.run(["scancel", *cluster.submitted], capture_output=True, timeout=COMMAND_TIMEOUT_S)


def _node_states() -> dict[str, tuple[str, str]]:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N|%T|%E"], capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT_S).stdout
    return {n: (state, reason) for n, state, reason in (line.split("|", 2) for line in out.splitlines())}


IDLE_WAIT_S = 600.0


@pytest.fixture
def idle_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The sandbox with every node idle, waited for rather than forced: other engineers' jobs on the
    shared sandbox run to their end (nothing is cancelled, unlike `slurm_cluster`). Afterwards the
    test's own jobs are cancelled and the nodes it drained are resumed."""
    state_dir = Path(os.environ.get("RESILIENT_SLURM_SANDBOX", DEFAULT_DIR))
    status = sandbox("status", state_dir, COMMAND_TIMEOUT_S)
    if status.returncode != 0:
        verdict = (status.stdout.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"Slurm sandbox not usable: {verdict}")
    monkeypatch.setenv("SLURM_CONF", str(state_dir / "slurm.conf"))
    cluster = SlurmCluster(state_dir)
    drained_before = {n for n, (state, _) in _node_states().items() if not state.startswith("idle")}
    if drained_before:
        cluster.wait_for("every node idle (another test is using the sandbox)",
                         lambda: all(s == "idle" for s, _ in _node_states().values()), IDLE_WAIT_S)
    yield cluster
    if cluster.submitted:
        subprocess.run(["scancel", *cluster.submitted], capture_output=True, timeout=COMMAND_TIMEOUT_S)
    ours = [n for n, (state, reason) in _node_states().items()
            if state.startswith(("drain", "down")) and reason.startswith("resilient_slurm")]
    if ours:
        cluster.run("scontrol", "update", f"nodename={','.join(ours)}", "state=resume")
        cluster.wait_for("the drained nodes back", lambda: all(
            _node_states()[n][0] in ("idle", "allocated", "mixed", "completing") for n in ours), 60)
