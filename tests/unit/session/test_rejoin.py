"""The ranks' side of a restart inside the surviving processes: which errors mean a peer is gone,
the driver's instruction file, and the rule of which failures allow it (recovery.inprocess_refusal)."""

import threading
import time

import pytest

from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.recovery import inprocess_refusal
from resilient_slurm.session import rejoin
from resilient_slurm.slurm.placement import Allocation, keep_positions
from resilient_slurm.slurm.srun import step_argv


@pytest.mark.parametrize("error, gone", [
    # gloo's own words when the peer's process died (seen on the sandbox cluster)
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:1234"),
     True),
    (RuntimeError("[pair.cc:534] Read error [127.0.0.1]:5555: Connection reset by peer"), True),
    (RuntimeError("NCCL communicator was aborted on rank 3"), True),
    # this rank's own faults are not a peer's death
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("loss is nan"), False),
    (MemoryError("out of memory"), False),
])
def test_a_collective_that_failed_because_a_peer_died_is_told_from_the_ranks_own_error(error, gone):
    assert rejoin.peer_gone(error) is gone


def test_a_peer_gone_under_a_pipeline_stage_is_found_in_the_error_it_was_raised_from():
    """torch.distributed.pipelining wraps a failed stage forward in its own RuntimeError (`raise ... from e`)."""
    try:
        try:
            raise RuntimeError("[pair.cc:553] Connection closed by peer [10.0.0.2]:1234")
        except RuntimeError as e:
            raise RuntimeError("[Stage 1] failed to run forward:\n args: ...") from e
    except RuntimeError as wrapped:
        assert rejoin.peer_gone(wrapped)
    assert not rejoin.peer_gone(RuntimeError("[Stage 1] failed to run forward"))


@pytest.mark.parametrize("hung, errors, survivors, same_size, refused", [
    (False, ["TaskLost: task 1 on n2 ended without a trace (Killed)"], 3, True, None),
    (False, ["RuntimeError: injected fault at step 60"], 1, True, None),
    (True, [], 3, True, "a hang"),
    # a peer timed out in a collective: some rank is hung, and cannot be told to rejoin
    (False, ["RuntimeError: [gloo/transport/tcp/pair.cc:446] Timed out waiting 30000ms for recv operation"], 1, True,
     "a hang"),
    (False, ["RuntimeError: CUDA error: an illegal memory access was encountered"], 3, True, "CUDA-class"),
    (False, ["RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error"], 3, True, "CUDA-class"),
    (False, ["GPU has fallen off the bus (Xid 79)"], 3, True, "CUDA-class"),
    # the failed rank's CUDA error, then its peers' silence or timeout while they wait for it: the error is the cause
    (True, ["RuntimeError: CUDA error: an illegal memory access was encountered"], 3, True, "CUDA-class"),
    (False, ["RuntimeError: CUDA error: an illegal memory access was encountered",
             "RuntimeError: [gloo/transport/tcp/pair.cc:446] Timed out waiting 30000ms for recv operation"], 1, True,
     "CUDA-class"),
    (False, ["TaskLost: Killed"], 0, True, "no rank survived"),
    (False, ["TaskLost: Killed"], 3, False, "changes size"),
])
def test_survivors_restart_in_their_processes_only_after_a_peers_death_on_clean_device_state(
        hung, errors, survivors, same_size, refused):
    why = inprocess_refusal(hung, errors, survivors, same_size)
    assert (why is None) if refused is None else (refused in why)


def test_a_replacement_takes_the_lost_nodes_position_so_every_survivor_keeps_its_ranks():
    after = Allocation(("a", "c", "d", "x"), ("y",), 4, 4, frozenset("b"))  # placement appends the spare
    kept = keep_positions(("a", "b", "c", "d"), after, ["b"])
    assert kept.in_use == ("a", "x", "c", "d") and kept.spares == ("y",)
    # in place (no node lost) and a shrink keep placement's own order
    same = Allocation(("a", "b"), (), 2, 2, frozenset())
    assert keep_positions(("a", "b"), same, []) == same
    shrunk = Allocation(("a", "c"), (), 3, 2, frozenset("b"))
    assert keep_positions(("a", "b", "c"), shrunk, ["b"]) == shrunk


def test_a_driven_step_whose_survivors_stay_is_not_ended_at_the_first_bad_exit():
    argv = step_argv(("n1",), 1, ["python"], survivors_stay=True, env=RankLaunch(driven=True, join=2).exports())
    assert "--kill-on-bad-exit=0" in argv
    (export,) = [a for a in argv if a.startswith("--export=ALL,")]
    assert RankLaunch.from_env(dict(e.split("=", 1) for e in export.split(",")[1:])).join == 2


def test_the_instruction_is_read_back_whole_and_a_waiting_rank_beats_until_it_comes(tmp_path):
    word = rejoin.Instruction(generation=1, job_step=7, master_addr="10.0.0.1", master_port=29512, world_size=4,
                              replaced={7: 2}, tasks_per_node=2, decided_at=123.5)
    path = rejoin.instruction_path(tmp_path, "55", 0, 1)
    beats = []
    writer = threading.Timer(0.3, rejoin.write_instruction, (tmp_path, "55", 0, word))
    writer.start()
    got = rejoin.await_instruction(path, 10.0, lambda: beats.append(1))
    writer.join()
    assert got == word  # the word, not the 10 s timeout's None
    assert len(beats) >= 3  # it kept beating while it waited: a survivor waiting is not hung


def test_no_word_within_the_timeout_is_none(tmp_path):
    began = time.monotonic()
    assert rejoin.await_instruction(rejoin.instruction_path(tmp_path, "1", 0, 1), 0.3) is None
    assert time.monotonic() - began >= 0.3  # it waited the whole timeout


def test_a_standby_is_woken_into_the_generation_the_driver_names(tmp_path):
    path = rejoin.wake_path(tmp_path, "55", 0, 3)
    writer = threading.Timer(0.2, rejoin.wake, (tmp_path, "55", 0, 3, 2))
    writer.start()
    assert rejoin.await_wake(path, lambda: False) == 2
    writer.join()
    # another standby's word is not this one's
    assert rejoin.wake_path(tmp_path, "55", 0, 4) != path


def test_a_standby_stops_waiting_when_the_job_stops(tmp_path):
    stopped = threading.Event()
    threading.Timer(0.2, stopped.set).start()
    assert rejoin.await_wake(rejoin.wake_path(tmp_path, "55", 0, 3), stopped.is_set) is None
