"""Submitting resilient runs to the sandbox cluster from tests, and watching them end."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.integration.runs import REPO, SMALL, events, finish, launch, run_dir

# Shorter than runs.SMALL's 200 steps: every failure these tests inject comes between the checkpoint
# of step 25 and the next (at 50), so each resumed run replays steps, and each step of a Slurm test
# runs beside the CPU-bound tests. A test that needs more steps says so.
STEPS = 60
SLURM_STEPS = f"train.max_steps={STEPS}"

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "PREEMPTED"}


def submit(root: Path, name: str, *overrides: str) -> str:
    """`python -m resilient_slurm.launch ... cluster=slurm`; returns the job id it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "resilient_slurm.launch", *SMALL, "cluster=slurm", f"run.root={root}",
         f"run.name={name}", "train.threads=1", SLURM_STEPS, *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"submitted job (\d+)", done.stdout).group(1)


_references: dict[tuple[int, tuple[str, ...]], Path] = {}


def reference(ranks: int, *overrides: str) -> Path:
    """The same training, uninterrupted, on this machine (no Slurm): what every resumed run must
    equal. Run once per session for each (ranks, overrides) and shared by the tests that need it."""
    key = (ranks, overrides)
    if key not in _references:
        root = Path(tempfile.mkdtemp(prefix="resilient-reference-"))
        atexit.register(shutil.rmtree, root, True)
        code, out = finish(launch(root, "ref", f"cluster.ranks={ranks}", "train.threads=1", SLURM_STEPS, *overrides),
                           timeout=600)  # 4 ranks at tp 2 x HSDP took over 180 s on CI
        assert code == 0, out
        _references[key] = run_dir(root, "ref")
    return _references[key]


def job_state(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                         timeout=30).stdout
    return dict(item.partition("=")[::2] for item in out.split())


def wait_until(what: str, probe, timeout_s: float, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_for_end(job_id: str, rdir: Path, timeout_s: float) -> str:
    """The job's final state; on timeout, the ledger and the job log say what happened."""
    def ended():
        state = job_state(job_id).get("JobState")
        return state if state in FINISHED else None
    try:
        return wait_until(f"job {job_id} to end", ended, timeout_s)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{describe(job_id, rdir)}") from None


def describe(job_id: str, rdir: Path) -> str:
    ledger = "\n".join(f"  {e.kind} step={e.step} rank={e.rank} {e.record.get('reason') or e.record.get('error') or ''}"
                       for e in (events(rdir) if (rdir / "events.jsonl").exists() else []))
    logs = "".join(p.read_text()[-1500:] for p in sorted((rdir / "slurm").glob(f"{job_id}_*_log.err")))
    return f"state: {job_state(job_id).get('JobState')}\nledger:\n{ledger}\nlogs:\n{logs}"


def wait_for_step(rdir: Path, step: int, timeout_s: float, job_id: str | None = None) -> None:
    """Until the run has logged `step`; on timeout, with a job to describe, what it did meanwhile."""
    from tests.integration.runs import last_step

    try:
        wait_until(f"step {step} in {rdir}", lambda: last_step(rdir) >= step, timeout_s, 0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{describe(job_id, rdir)}" if job_id else str(e)) from None


def task_pid(job_id: str, procid: int) -> int | None:
    """The pid of task `procid` of a job, found through /proc (every sandbox node is this machine)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={procid}".encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            # The task's python, not the srun (or shell) that launched it.
            if not Path(argv[0].decode()).name.startswith("python") or b"submitit.core._submit" not in argv:
                continue
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(proc.name)
    return None


def kill_task(job_id: str, procid: int) -> int:
    pid = wait_until(f"task {procid} of job {job_id}", lambda: task_pid(job_id, procid), 30)
    os.kill(pid, 9)
    return pid


def driven_tasks(job_id: str):
    """(pid, environment) of each task process the job's driver started on this machine's nodes."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not Path(argv[0].decode()).name.startswith("python") or b"resilient_slurm.supervise.task" not in argv:
                continue
            env = dict(item.partition(b"=")[::2] for item in (proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if env.get(b"SLURM_JOB_ID") == job_id.encode():
            yield int(proc.name), env


def driven_task(job_id: str, procid: int) -> tuple[int, int, str] | None:
    """(job step, pid, node) of task `procid` in the newest job step a job's driver started."""
    found = [(int(env.get(b"SLURM_STEP_ID", b"0")), pid, env[b"SLURMD_NODENAME"].decode())
             for pid, env in driven_tasks(job_id) if env.get(b"SLURM_PROCID") == str(procid).encode()]
    return max(found) if found else None


def kill_driven_task(job_id: str, procid: int, job_step: int = 0) -> str:
    """SIGKILL task `procid` of the job's step `job_step` or a later one; returns its node."""
    def current():
        hit = driven_task(job_id, procid)
        return hit if hit and hit[0] >= job_step else None
    _, pid, node = wait_until(f"task {procid} of job {job_id}, step {job_step}", current, 60)
    os.kill(pid, 9)
    return node
