"""When a rank's silence is a hang: the timeout, a phase's own allowance, the start allowance."""

import pytest

from resilient_slurm.monitor.heartbeats import Beat, culprits, silent_ranks


def beat(rank, step=5, phase="step", allow=0.0):
    return Beat(rank, step, phase, allow)


@pytest.mark.parametrize("last, now, expected", [
    ({0: (beat(0), 100.0), 1: (beat(1), 100.0)}, 129.0, []),                   # both within 30 s
    ({0: (beat(0), 100.0), 1: (beat(1), 60.0)}, 100.0, [1]),                  # rank 1 silent 40 s
    ({0: (beat(0), 100.0), 1: (beat(1, phase="save", allow=600), 60.0)}, 100.0, []),  # announced its save
    ({0: (beat(0), 100.0), 1: (beat(1, phase="save", allow=600), 60.0)}, 700.0, [0, 1]),
    ({0: (beat(0), 100.0)}, 100.0, []),                                         # rank 1 still starting ...
    ({0: (beat(0), 900.0)}, 900.0, [1]),                                        # ... past the start allowance
])
def test_silent_ranks(last, now, expected):
    found = silent_ranks(last, [0, 1], now, started_at=0.0, timeout_s=30.0, start_allow_s=600.0)
    assert [s.rank for s in found] == expected
    for s in found:
        assert s.silent_s > s.limit_s and str(s.rank) in s.describe()


def test_a_zero_timeout_turns_heartbeats_off():
    assert silent_ranks({}, [0, 1], 10_000.0, 0.0, 0.0, 600.0) == []


def test_a_beat_survives_the_wire_and_garbage_is_ignored():
    b = Beat(3, 17, "micro_batch", 0.0, generation=2)
    assert Beat.decode(b.encode()) == b
    assert Beat.decode(b"not json") is None and Beat.decode(b"[1, 2]") is None


def test_the_culprit_is_the_silent_rank_no_longer_alive_or_every_one_when_all_are():
    last = {0: (beat(0), 0.0), 1: (beat(1), 0.0), 2: (beat(2), 0.0)}
    waiting_for_2 = silent_ranks(last, [0, 1, 2], 40.0, 0.0, 30.0, 600.0, alive_at={0: 39.5, 1: 39.0})
    assert [s.rank for s in waiting_for_2] == [0, 1, 2] and [s.rank for s in culprits(waiting_for_2)] == [2]
    deadlocked = silent_ranks(last, [0, 1, 2], 40.0, 0.0, 30.0, 600.0, alive_at={0: 39.5, 1: 39.0, 2: 39.9})
    assert [s.rank for s in culprits(deadlocked)] == [0, 1, 2]
