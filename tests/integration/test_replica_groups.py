"""Replica groups on this machine (cluster.replica_ft, two groups of one rank, the local launcher):
a group that dies is the only one that stops. The other group's process keeps running (the same
pid from the first step to the last), drops the step it was in and goes on alone with both
groups' micro-batches; the launcher starts the lost group anew, which heals from the live one over
the network (no checkpoint read: the ledger has no resume) and joins at a step boundary. No step is
lost (metrics-lost.jsonl stays empty, metrics.jsonl has every step once), and the losses match an
uninterrupted twin, plain HSDP over the same two ranks, within 1e-4 relative (the sums' order
differs while a group is missing). Real processes, a real SIGKILL, torchft's lighthouse and
transport; nothing is faked. While the lost group is away, the test holds the live group to a
fifth of the time (SIGSTOP/SIGCONT) until the join is on record: on a loaded machine the
replacement's start (an interpreter, torch's imports) otherwise took longer than the live group's
remaining steps, and it joined a finished run. One test only (the suite's time): a hang's detection and the
refusals are the same launcher paths after the failure is found, and the refusals' rules are
unit-tested (tests/unit/replica/test_replica_plan.py)."""

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.process.launch import RankLaunch
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step

GROUP = RankLaunch.variable("replica_group")
"""The variable that names a rank's replica group (how a test finds a group's processes)."""

pytestmark = pytest.mark.slow

STEPS = 60
HSDP = ["cluster.ranks=2", "parallel.dp_replicate=2", f"train.max_steps={STEPS}", "checkpoint.every_steps=20",
        "train.threads=1", "tracking.mode=disabled"]
GROUPS = [*HSDP, "cluster.replica_ft=true", "cluster.replica_timeout_s=10"]


def group_pid(rdir: Path, group: int) -> int | None:
    """The process of group `group`'s (only) rank, if one runs."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if b"resilient_slurm.runtime.rank" in argv and str(rdir).encode() in argv and \
                f"{GROUP}={group}".encode() in env:
            return int(proc.name)
    return None


def losses(rdir: Path, name: str = "metrics.jsonl") -> dict[int, float]:
    path = rdir / name
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {r["step"]: r["loss"] for r in rows}


def wait_for_event(proc, rdir: Path, kind: Kind, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in events(rdir) if e.kind is kind]
        if found:
            return found[0]
        assert proc.poll() is None, f"run exited {proc.returncode} before {kind}:\n{proc.stdout.read()}"
        time.sleep(0.05)
    raise AssertionError(f"no {kind} in {timeout_s:.0f} s")


@contextlib.contextmanager
def held_back(pid: int, stopped_s: float = 0.4, running_s: float = 0.1):
    """`pid` runs `running_s` of every `stopped_s + running_s` until the block ends: slow, never
    stopped long enough for a heartbeat (the lighthouse's, the launcher's) to miss it."""
    done = threading.Event()

    def cycle():
        while not done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            done.wait(stopped_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            done.wait(running_s)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    root = tmp_path_factory.mktemp("twin")
    code, out = finish(launch(root, "twin", *HSDP))
    assert code == ExitCode.DONE, out
    return losses(run_dir(root, "twin"))


def assert_matches_twin(rdir: Path, twin: dict[int, float]) -> None:
    got = losses(rdir)
    assert list(got) == list(range(1, STEPS + 1)), "every step once, in order"
    assert not losses(rdir, "metrics-lost.jsonl"), "no step was lost"
    for step, loss in got.items():
        assert abs(loss - twin[step]) <= 1e-4 * abs(twin[step]), (step, loss, twin[step])


def test_a_killed_group_is_replaced_from_the_live_one_and_the_run_matches_its_twin(tmp_path, twin):
    proc = launch(tmp_path, "killed", *GROUPS, "fault.step_sleep_s=0.05")
    rdir = run_dir(tmp_path, "killed")
    wait_for_step(proc, rdir, 15)
    survivor, victim = group_pid(rdir, 0), group_pid(rdir, 1)
    assert survivor and victim
    with held_back(survivor):
        os.kill(victim, signal.SIGKILL)
        join = wait_for_event(proc, rdir, Kind.REPLICA_JOIN)
    assert group_pid(rdir, 0) == survivor, "the live group's process never stopped"
    replacement = group_pid(rdir, 1)
    code, out = finish(proc)
    assert code == ExitCode.DONE, out

    ev = events(rdir)
    kinds = [e.kind for e in ev]
    assert kinds.count(Kind.START) == 1 and Kind.RESUME not in kinds, "one attempt; nothing read a checkpoint"
    (leave,) = [e for e in ev if e.kind is Kind.REPLICA_LEAVE]
    (heal,) = [e for e in ev if e.kind is Kind.REPLICA_HEAL]
    assert (leave.details.group, leave.details.live, leave.rank) == (1, [0], 0)
    assert (heal.details.group, heal.details.source, heal.rank) == (1, 0, 1) and heal.details.bytes > 0
    assert (join.details.group, join.details.live, join.rank) == (1, [0, 1], 1)
    print(f"group 1 left at step {leave.step}, healed at {heal.step}, joined at {join.step} of {STEPS}")
    assert replacement != victim and 15 < heal.step <= join.step < STEPS
    rows = [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]
    short = [r["step"] for r in rows if r["replica_missing"]]
    assert short and all(leave.step < s <= join.step for s in short), short
    assert_matches_twin(rdir, twin)
