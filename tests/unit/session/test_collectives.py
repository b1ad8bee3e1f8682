"""A rank's collectives as its heartbeat reports them: the training thread's waits (a real `Work`
whose future another thread completes), the step's sections without them, each process group's
sequence number (a real one-rank gloo group), and the flight recorder's environment."""

import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.futures import Future

from resilient_slurm.session import collectives
from resilient_slurm.session.sections import StepSections

DELAY_S = 0.2


def blocked_wait(timed: bool = True) -> None:
    """The calling thread waits in a collective until another thread completes it, DELAY_S after the
    wait began as the clock saw it (`timed`: the training thread's), or after the call (another
    thread's, which the clock does not time). Not a timer started before the wait: the wait it
    measures would be short by however long this thread took to reach it."""
    done = Future()
    work = torch._C._distributed_c10d._create_work_from_future(done)

    def complete() -> None:
        while timed and collectives.waiting_s() is None:
            time.sleep(0.001)
        time.sleep(DELAY_S)
        done.set_result(None)

    threading.Thread(target=complete).start()
    work.wait()


def test_the_training_threads_waits_count_as_the_collective_section_not_its_compute():
    collectives.install()
    sections = StepSections()
    with sections.timed("forward"):
        blocked_wait()
    # another thread's wait (a background save's) is not the step's
    other = threading.Thread(target=blocked_wait, args=(False,))
    other.start()
    other.join()
    s = sections.take()
    assert s["collective"] >= DELAY_S and s["forward"] < s["collective"]
    assert s["forward"] + s["collective"] <= s["step"]
    assert collectives.waiting_s() is None
    assert sections.take()["collective"] == 0.0  # the next step starts afresh


def test_every_process_group_reports_its_sequence_number():
    made = not dist.is_initialized()  # another test of this process may have left its group
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        side = dist.new_group(backend="gloo")
        before = {name: seq for name, _, seq in collectives.sequences()}
        t = torch.ones(1)
        dist.all_reduce(t, group=side)
        dist.all_reduce(t, group=side)
        after = {name: seq for name, _, seq in collectives.sequences()}
        assert after == {**before, side.group_name: before[side.group_name] + 2}
        default = dist.distributed_c10d._get_default_group().group_name
        dist.all_reduce(t)
        assert {name: seq for name, _, seq in collectives.sequences()}[default] == after[default] + 1
    finally:
        if made:
            dist.destroy_process_group()


def test_the_flight_recorder_is_set_before_the_process_groups_and_dumps_into_the_logs():
    env = collectives.flight_recorder_env(2000, Path("/runs/r/logs"))
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_FR_DUMP_TEMP_FILE": "/runs/r/logs/flight-recorder-rank"}
    assert collectives.flight_recorder_env(0, Path("/x")) == {}
