"""The memory tier in real runs (2 gloo ranks, real processes, SIGKILL): a killed run resumes from
its memory checkpoint, newer than the disk's, and ends bit-identical to a run never interrupted;
on two "nodes" (tests/integration/nodes.py: the node names are given to the processes), a node
that lost its memory resumes from its buddy's copy, and with both copies of its files gone the
run resumes from the disk, still bit-identical.

Disk saves every 25 steps, memory saves every 5: a kill after the memory save of step 30 leaves the
disk at 25."""

import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import MemorySave, Resume, Save, select
from tests.integration import nodes
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, launch, run_dir

pytestmark = pytest.mark.slow

STEPS = 50
COMMON = [f"train.max_steps={STEPS}", "checkpoint.memory.every_steps=5"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """Two ranks straight through, no memory tier: the final state every interrupted run must reach."""
    root = tmp_path_factory.mktemp("twin")
    code, out = finish(launch(root, "straight", "cluster.ranks=2", f"train.max_steps={STEPS}"))
    assert code == ExitCode.DONE, out
    return final_tensors(run_dir(root, "straight"), STEPS)


@pytest.fixture
def shm():
    """A memory tier directory of this test's own, on tmpfs."""
    path = Path("/dev/shm") / f"rs-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def memory_saved(at_least: int, buddy: bool = False):
    def found(ev):
        return any(e.step >= at_least and e.details.ok and (e.details.buddy_bytes > 0 or not buddy)
                   for e in select(ev, MemorySave))
    return found


def test_a_killed_run_resumes_from_its_memory_tier_and_ends_bit_identical(tmp_path, shm, twin):
    args = ["cluster.ranks=2", *COMMON, f"checkpoint.memory.dir={shm}"]
    rdir = run_dir(tmp_path, "memory")
    proc = launch(tmp_path, "memory", *args)
    nodes.wait_for([proc], rdir, memory_saved(30))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    ev = events(rdir)
    newest_memory = max(e.step for e in select(ev, MemorySave) if e.details.ok)
    assert max(e.step for e in select(ev, Save)) == 25 < newest_memory

    code, out = finish(launch(tmp_path, "memory", *args))
    assert code == ExitCode.DONE, out
    (resume,) = select(events(rdir), Resume)
    assert (resume.details.source, resume.step) == ("memory", newest_memory)
    assert resume.details.checkpoint.startswith(str(shm))
    assert_bit_identical(twin, final_tensors(rdir, STEPS))
    assert not (shm / "tiny_sft").exists()  # the finished run removed its tier


def test_a_node_that_lost_its_memory_loads_from_its_buddy_then_from_disk_when_both_copies_are_gone(tmp_path, shm,
                                                                                                  twin):
    rdir = nodes.prepare(tmp_path, "two-nodes", *COMMON, f"checkpoint.memory.dir={shm}/%n")
    tier = {n: shm / n / "tiny_sft" / "two-nodes" for n in ("a", "b")}

    procs = nodes.start(rdir, ("a", "b"))
    nodes.wait_for(procs, rdir, memory_saved(30, buddy=True))
    nodes.kill(procs)
    first = max(e.step for e in select(events(rdir), MemorySave) if e.details.ok and e.details.buddy_bytes)
    assert (tier["b"] / ".buddy" / "a" / f"step_{first:08d}").is_dir()
    shutil.rmtree(shm / "a")  # node a rebooted: its memory is gone, its buddy b still holds a copy

    procs = nodes.start(rdir, ("a", "b"))
    ev = nodes.wait_for(procs, rdir, lambda ev: select(ev, Resume) and memory_saved(select(ev, Resume)[0].step + 10,
                                                                                      buddy=True)(ev))
    nodes.kill(procs)
    (resume,) = select(ev, Resume)
    assert (resume.details.source, resume.step) == ("buddy", first)
    # node a loses its memory again, and this time so does the copy of its files on b
    shutil.rmtree(shm / "a")
    shutil.rmtree(tier["b"] / ".buddy" / "a")
    newest_disk = max(e.step for e in select(events(rdir), Save))

    results = nodes.finish(nodes.start(rdir, ("a", "b")))
    assert all(code == ExitCode.DONE for code, _ in results), results
    third = select(events(rdir), Resume)[-1]
    assert (third.details.source, third.step) == ("hot", newest_disk)
    assert_bit_identical(twin, final_tensors(rdir, STEPS))
    assert not (shm / "a" / "tiny_sft").exists() and not (shm / "b" / "tiny_sft").exists()
