"""The driver's pool of standbys, with real processes in place of srun (no Slurm here): each prints
srun's `-v` line naming its step, as srun does, then waits like a standby's task until SIGTERM."""

import sys
import time

from resilient_slurm.supervise.standby import Standbys
from resilient_slurm.supervise.steps import Generation

FAKE_SRUN = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("srun: launching StepId=77.{step} on host {node}, 1 tasks: 0", file=sys.stderr, flush=True)
if {fail}:
    print("srun: error: {node}: task 0: Exited with exit code 3", file=sys.stderr, flush=True)
    sys.exit(3)
while True:
    time.sleep(0.05)
"""


def fake_srun(steps: dict[str, int], fail: str = ""):
    return lambda node: [sys.executable, "-c", FAKE_SRUN.format(step=steps[node], node=node, fail=node == fail)]


def named(pool: Standbys, count: int) -> None:
    deadline = time.monotonic() + 30
    while sum(s.step_id is not None for s in pool.pool.sruns) < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_standby_is_taken_on_its_node_and_its_reports_become_the_generations():
    pool = Standbys()
    pool.start(fake_srun({"n3": 5, "n4": 6}), ["n3", "n4"], 1)
    named(pool, 2)
    assert pool.take("n9") is None
    taken = pool.take("n4")
    assert taken is not None and taken.step_id == 6 and [s.nodes for s in pool.pool.sruns] == [("n3",)]
    gen = Generation([])
    gen.adopt(taken)
    assert gen.running() and taken.owner is gen
    pool.dismiss("77")
    assert not pool.pool.sruns and taken.proc.poll() is None  # the woken one is the generation's now
    taken.proc.terminate()
    taken.proc.wait(10)


def test_a_standby_that_died_is_not_taken_and_its_report_is_nobodys():
    pool = Standbys()
    pool.start(fake_srun({"n3": 5}, fail="n3"), ["n3"], 1)
    named(pool, 1)
    pool.pool.sruns[0].proc.wait(10)
    deadline = time.monotonic() + 10
    while not pool.pool.reports:  # srun's stderr is read by a thread
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pool.take("n3") is None
    pool.dismiss("77")


def test_dismissed_standbys_exit_and_leave_their_nodes_free():
    pool = Standbys()
    pool.start(fake_srun({"n3": 5}), ["n3"], 2)
    named(pool, 2)
    procs = [s.proc for s in pool.pool.sruns]
    pool.dismiss("77")
    assert [p.returncode for p in procs] == [0, 0]  # their SIGTERM handler's status: dismissed, not killed
