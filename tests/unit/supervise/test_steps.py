"""Killing a start's sruns, with real processes in place of srun (no Slurm here) and scancel
recorded instead of run: one srun named its step (`-v`), the other is still waiting for nodes the
job's other steps hold and named none. A CI run once killed the whole job for the second: `scancel
--signal=KILL JOB` without a step id cancels the job."""

import sys

import pytest

from resilient_slurm.slurm import scontrol
from resilient_slurm.supervise.steps import Generation

NAMED = """
import sys, time
print("srun: launching StepId=77.3 on host n1, 2 tasks: [0-1]", file=sys.stderr, flush=True)
time.sleep(600)
"""
WAITING = """
import sys, time
print("srun: Job 77 step creation temporarily disabled, retrying (Requested nodes are busy)", file=sys.stderr,
      flush=True)
time.sleep(600)
"""


@pytest.fixture
def scancels(monkeypatch):
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(scontrol, "kill_step", lambda job, step: sent.append((job, step)) or (True, ""))
    return sent


def test_a_named_step_is_killed_by_its_id_and_an_unnamed_srun_alone(scancels):
    gen = Generation([])
    named = gen.start([sys.executable, "-c", NAMED], ("n1",))
    waiting = gen.start([sys.executable, "-c", WAITING], ("n1",))
    assert named.named.wait(30)
    assert named.kill("77") == (True, "") and scancels == [("77", 3)]
    named.proc.kill()  # what scancel would have done to its tasks; srun then exits
    assert waiting.kill("77") == (True, "")
    assert waiting.proc.wait(30) == -9 and scancels == [("77", 3)]  # never the job: no scancel without a step


def test_an_srun_that_has_exited_is_left_alone(scancels):
    gen = Generation([])
    done = gen.start([sys.executable, "-c", "pass"], ("n1",))
    done.proc.wait(30)
    assert done.kill("77") == (True, "") and scancels == []
