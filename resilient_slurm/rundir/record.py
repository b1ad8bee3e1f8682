"""The run record, `record.jsonl`: what ran where, with which code, one line per launch and per attempt.

A launch line has the command-line overrides; an attempt line (written by rank 0 as each job or
requeue starts) has the Slurm job id, restart count and node list, the software versions, and the
git state of the code that actually runs: commit, branch, dirty flag, untracked files, and the
full diff against the commit (`git diff HEAD` plus the untracked files up to 1 MiB each, as new
files), saved once per distinct diff under `git/`. Together with `config.yaml` and
`run.json` this is enough to rerun the run months later; `report` prints it with the ledger's
started/finished times and the last checkpoint.

Gathering (git, imports, environment) is kept apart from composing the lines, which is pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from resilient_slurm.files import atomic_write, utc_stamp
from resilient_slurm.ledger import read_jsonl
from resilient_slurm.rundir.paths import RunDir
from resilient_slurm.slurm.env import SlurmEnv

GIT_DIR = "git"
"""`RunDir.git`, relative: record lines name a diff by its path inside the run directory."""
GIT_TIMEOUT_S = 10.0
UNTRACKED_MAX_BYTES = 1 << 20
"""Untracked files up to this size go into the saved diff; larger ones (data, outputs) are only listed."""
SOURCE_ROOT = Path(__file__).resolve().parents[1]
"""The checkout the package runs from: its git state is the code of the run."""
_PACKAGES = ("numpy", "safetensors", "hydra-core", "submitit", "wandb")


@dataclass(frozen=True)
class GitState:
    commit: str | None = None
    branch: str | None = None
    """None when detached."""
    dirty: bool = False
    """Tracked files differ from the commit (their diff is saved); untracked files are only listed."""
    untracked: list[str] = field(default_factory=list)
    diff: str = ""
    """Patch from the commit to the working tree, untracked files included; empty when clean."""
    error: str | None = None
    """Why there is no git state (not a checkout, git missing, timeout)."""


def parse_status(porcelain_z: str) -> tuple[bool, list[str]]:
    """(dirty, untracked paths) from `git status --porcelain=v1 -z`. Pure."""
    entries = porcelain_z.split("\0")
    dirty, untracked = False, []
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if code == "??":
            untracked.append(path)
        elif code != "!!":
            dirty = True
            if "R" in code or "C" in code:
                i += 1  # a rename or copy is followed by its source path
    return dirty, untracked


def git_state(repo: Path = SOURCE_ROOT, timeout_s: float = GIT_TIMEOUT_S) -> GitState:
    """The checkout's state through the `git` command (argv, no shell, a timeout each); never raises."""
    def git(*args: str, ok: tuple[int, ...] = (0,)) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
            check=False, text=True, errors="replace",
            # Reading must not take the index lock another git process may hold.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
        if done.returncode not in ok:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        branch = git("rev-parse", "--abbrev-ref", "HEAD").strip()
        dirty, untracked = parse_status(git("status", "--porcelain=v1", "-z", "--untracked-files=all"))
        diff = git("diff", "HEAD", "--no-color", "--no-ext-diff", "--binary") if dirty else ""
        for path in untracked:
            if (repo / path).is_file() and (repo / path).stat().st_size <= UNTRACKED_MAX_BYTES:
                # --no-index exits 1 when the files differ, which they always do here.
                diff += git("diff", "--no-index", "--no-color", "--binary", "--", "/dev/null", path, ok=(0, 1))
    except subprocess.CalledProcessError as e:
        why = (e.stderr or "").strip().splitlines()
        return GitState(error=f"git {e.cmd[3]} exited {e.returncode}: {why[0] if why else 'no message'}")
    except subprocess.TimeoutExpired as e:
        return GitState(error=f"git {e.cmd[3]} did not finish within {timeout_s:g} s")
    except OSError as e:
        return GitState(error=f"cannot run git: {e.strerror}")
    return GitState(commit, None if branch == "HEAD" else branch, dirty, untracked, diff)


def software_versions() -> dict[str, str | None]:
    """Python, torch, CUDA, NCCL, the GPU driver (where present) and the main libraries."""
    import torch

    versions: dict[str, str | None] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": None, "nccl": None, "driver": None, "gpu": None,
    }
    for name in ("resilient-slurm", *_PACKAGES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if torch.cuda.is_available():
        versions["cuda"] = torch.version.cuda
        versions["gpu"] = torch.cuda.get_device_name(0)
        if hasattr(torch.cuda, "nccl"):
            nccl = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        versions["driver"] = _driver_version()
    return versions


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no pynvml or NVMLError: the record just lacks the driver
        return f"unknown ({type(e).__name__})"
    return version.decode() if isinstance(version, bytes) else str(version)


def process_started() -> str | None:
    """UTC time this process started (from /proc), so the report counts start-up (imports, model
    build, tracker) as time the attempt held its resources. None where /proc cannot tell."""
    try:
        # Field 22 of /proc/self/stat (the 20th after the command name's closing parenthesis).
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    started = time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    return utc_stamp(started)


def diff_name(git: GitState) -> str | None:
    """`git/<commit12>-<sha8 of the diff>.diff`, or None for a clean checkout. Pure."""
    if not git.diff:
        return None
    digest = hashlib.sha256(git.diff.encode()).hexdigest()[:8]
    return f"{GIT_DIR}/{(git.commit or 'nocommit')[:12]}-{digest}.diff"


def launch_line(now: str, overrides: list[str], resumed: bool, host: str) -> dict[str, Any]:
    return {"kind": "launch", "time": now, "overrides": list(overrides), "resumed": resumed, "host": host}


def attempt_line(
    now: str, attempt: int, world_size: int, env: SlurmEnv | None, host: str, pid: int, git: GitState,
    versions: dict[str, str | None], data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One attempt's record: config (in config.yaml), code (git) and data versions. Pure."""
    git_fields = {k: v for k, v in asdict(git).items() if k != "diff"}
    return {
        "kind": "attempt", "time": now, "attempt": attempt, "world_size": world_size,
        "job_id": env.job_id if env else None, "restart": env.restart_count if env else None,
        "nodes": list(env.nodes) if env else [host], "host": host, "pid": pid,
        "git": {**git_fields, "diff": diff_name(git)}, "versions": versions, "data": data,
    }


def record_launch(run_dir: Path, overrides: list[str], resumed: bool) -> None:
    _append(run_dir, launch_line(utc_stamp(), overrides, resumed, socket.gethostname()))


def record_attempt(run_dir: Path, world_size: int, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Gather this attempt's facts and append them; the diff is saved once per distinct content."""
    git = git_state()
    name = diff_name(git)
    if name and not (run_dir / name).exists():
        RunDir(run_dir).git.mkdir(exist_ok=True)
        atomic_write(run_dir / name, git.diff)
    attempt = 1 + sum(1 for line in read_record(run_dir) if line["kind"] == "attempt")
    line = attempt_line(utc_stamp(), attempt, world_size, SlurmEnv.from_env(), socket.gethostname(), os.getpid(),
                        git, software_versions(), data)
    _append(run_dir, line)
    return line


def read_record(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of the run record."""
    return read_jsonl(RunDir(run_dir).record)


def _append(run_dir: Path, line: dict[str, Any]) -> None:
    # One write on an O_APPEND descriptor: a launch and a running job never interleave a line.
    fd = os.open(RunDir(run_dir).record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, default=str) + "\n").encode())
    finally:
        os.close(fd)
