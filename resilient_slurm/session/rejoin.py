"""Restart inside the surviving processes: the ranks' side of the protocol the Slurm job's driver runs.

When a rank's process dies, its peers' next collective fails at once (gloo: "Connection closed by
peer"). A survivor in a driven step does not exit then: it tears its trainer and process group down,
records `peer_lost`, and waits for the driver's word, an instruction file for the next generation:
the new world's rendezvous (master address and port), the Slurm step its attempt now belongs to,
and the generation its heartbeats carry. With it, the survivor builds its trainer again in the same
interpreter (torch imported, no new process), resumes from the memory tier (its own node's copy,
or the buddy's) and goes on; only the replacement ranks start new processes, on a spare node. No
word within `cluster.rejoin_timeout_s` (the driver chose a step restart, or died): the survivor
exits as before, and the driver's usual restart follows.

A survivor is trusted only after a peer's death: its own error, or a CUDA-class one, ends it as any
crash does (`recovery.inprocess_refusal` is the driver's side of that rule).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from resilient_slurm.files import atomic_write
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.rundir import RunDir

POLL_S = 0.05

# What gloo (and NCCL, through torch) say when a peer of a collective is gone.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "remote process exited", "Socket closed")


@dataclass(frozen=True)
class Instruction:
    """The driver's word to the ranks of the next generation."""

    generation: int
    job_step: int
    """The Slurm step of the replacement ranks: the attempt key every rank of the generation writes under."""
    master_addr: str
    master_port: int
    world_size: int
    replaced: dict[int, int]
    """Global rank of a replacement step's first task, by the step's id (its tasks add SLURM_PROCID)."""
    tasks_per_node: int
    """Ranks per node: a replacement's local rank (its GPU) is its rank modulo this."""
    decided_at: float
    """time.time() when the driver decided (the restart's breakdown counts from the failure to it)."""
    replica_group: int | None = None
    """A replica group's replacement (cluster.replica_ft): the group its ranks form, alone, healing
    from a live group; None: a generation of every rank."""


def peer_gone(error: BaseException | None) -> bool:
    """The exception is a collective's failure because a peer is gone, not this rank's own fault, or
    was raised from one (a pipeline stage's forward wraps what failed inside it). Pure."""
    while error is not None:
        if any(marker in str(error) for marker in PEER_GONE):
            return True
        error = error.__cause__
    return False


def instruction_path(run_dir: Path, job_id: str, restart: int, generation: int) -> Path:
    return RunDir(run_dir).slurm / "rejoin" / f"{job_id}.{restart}.{generation}.json"


def write_instruction(run_dir: Path, job_id: str, restart: int, instruction: Instruction) -> Path:
    path = instruction_path(run_dir, job_id, restart, instruction.generation)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(asdict(instruction)) + "\n")
    return path


def wake_path(run_dir: Path, job_id: str, restart: int, step_id: int) -> Path:
    """Where the driver tells the standby step `step_id` which generation it joins."""
    return RunDir(run_dir).slurm / "rejoin" / f"{job_id}.{restart}.standby-{step_id}.json"


def wake(run_dir: Path, job_id: str, restart: int, step_id: int, generation: int) -> None:
    path = wake_path(run_dir, job_id, restart, step_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"generation": generation}) + "\n")


def await_wake(path: Path, stopped: Callable[[], bool]) -> int | None:
    """The generation a standby is woken into; None once `stopped()` (the job ends or stops)."""
    while not stopped():
        try:
            return int(json.loads(path.read_text())["generation"])
        except (OSError, ValueError, KeyError):
            time.sleep(POLL_S)
    return None


def read_instruction(path: Path) -> Instruction | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    raw["replaced"] = {int(k): int(v) for k, v in raw["replaced"].items()}
    return Instruction(**raw)


def await_instruction(path: Path, timeout_s: float, beat: Callable[[], None] | None = None) -> Instruction | None:
    """Wait for the driver's instruction file; None after `timeout_s`. `beat()` is called while waiting
    (the heartbeat: a survivor waiting for its peers is not hung)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = read_instruction(path) if path.exists() else None
        if found is not None:
            return found
        if beat is not None:
            beat()
        time.sleep(POLL_S)
    return None


def generation() -> int:
    """The generation this rank belongs to (`RankLaunch.generation`; a rank that joined a later one
    marked it in its environment)."""
    return RankLaunch.from_env(os.environ).generation
