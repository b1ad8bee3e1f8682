"""When a rank's silence is a hang (the timeout, its own typical gap, a phase's allowance, the start
allowance, liveness), and whom the others wait for (the wavefront of the process groups' sequence
numbers)."""

import pytest

from resilient_slurm.monitor.heartbeats import (
    ALIVE,
    EXIT,
    Beat,
    Limits,
    RankState,
    culprits,
    silent_ranks,
    wavefront,
)

LIMITS = Limits(timeout_s=6.0, factor=10.0, alive_s=3.0, start_allow_s=600.0)


def beat(rank, step=5, phase="step", allow=0.0, seqs=()):
    return Beat(rank, step, phase, allow, collectives=tuple(("0", "default_pg", s) for s in seqs))


def state(*beats_at, alive_at=None):
    """A rank's state after progress beats at the given times (gaps of the last ones are learnt)."""
    s = RankState()
    for b, at in beats_at:
        s.receive(b, at)
    if alive_at is not None:
        s.receive(Beat(s.last.rank if s.last else 0, -1, ALIVE, 0.0), alive_at)
    return s


def steady(rank, until, gap=0.1, phase="step", allow=0.0, alive_at=None):
    """A training rank that beat every `gap` s up to `until` (its typical gap is `gap`)."""
    beats = [(beat(rank), until - gap * k) for k in range(5, 0, -1)] + [(beat(rank, phase=phase, allow=allow), until)]
    return state(*beats, alive_at=alive_at)


@pytest.mark.parametrize("states, now, expected", [
    # alive, beating: within the 6 s floor
    ({0: steady(0, 100.0, alive_at=105.9), 1: steady(1, 100.0, alive_at=105.9)}, 105.9, []),
    # alive but no progress for 7 s: past the floor (its 0.1 s gaps x 10 is below it)
    ({0: steady(0, 106.0, alive_at=106.9), 1: steady(1, 100.0, alive_at=106.9)}, 107.0, [1]),
    # a long-step loop (gaps of 5 s) gets 10 x 5 s
    ({0: steady(0, 100.0, gap=5.0, alive_at=149.0)}, 149.0, []),
    ({0: steady(0, 100.0, gap=5.0, alive_at=151.0)}, 151.0, [0]),
    # neither progress nor liveness for 3 s while training: stopped, found at once
    ({0: steady(0, 103.5, alive_at=103.5), 1: steady(1, 100.0, alive_at=100.2)}, 103.5, [1]),
    # ... but not inside an announced phase (a save may hold the interpreter): its allowance counts
    ({0: steady(0, 100.0, phase="save", allow=600.0, alive_at=100.2)}, 150.0, []),
    ({0: steady(0, 100.0, phase="save", allow=600.0, alive_at=100.2)}, 701.0, [0]),
    # a replica group's quorum only waits on the others: not alive there is stopped, as in training
    ({0: steady(0, 100.0, phase="quorum", allow=600.0, alive_at=100.2)}, 103.5, [0]),
    ({0: steady(0, 100.0, phase="quorum", allow=600.0, alive_at=103.4)}, 103.5, []),
    # before the first beat: the start allowance, counted from the monitor's start
    ({0: steady(0, 100.0, alive_at=100.0)}, 100.0, []),
    ({}, 599.0, []),
    ({}, 601.0, [0]),
    # until its typical gap is known (its first beats), a rank gets the start allowance too
    ({0: state((beat(0), 100.0), (beat(0), 101.0), alive_at=150.0)}, 150.0, []),
    # a rank that said it exits is never silent
    ({0: state((beat(0), 100.0), (Beat(0, -1, EXIT, 600.0), 101.0))}, 10_000.0, []),
])
def test_silent_ranks(states, now, expected):
    ranks = sorted(states) or [0]
    found = silent_ranks(states, ranks, now, started_at=0.0, limits=LIMITS)
    assert [s.rank for s in found] == expected
    for s in found:
        assert s.silent_s > s.limit_s and str(s.rank) in s.describe()


def test_a_rank_that_waited_for_a_replaced_group_is_silent_only_from_the_replacement():
    """Group 1's rank stopped; group 0's rank waited for it in the cross-group reduction since its
    last beat at 100. The driver replaced group 1 at 105: group 0's rank is not hung at 107 for
    the wait, only if it stays silent past the timeout from 105."""
    survivor = steady(0, 100.0, alive_at=106.9)
    assert [s.rank for s in silent_ranks({0: survivor}, [0], 107.0, 0.0, LIMITS)] == [0]
    survivor.waited_at = 105.0
    assert silent_ranks({0: survivor}, [0], 107.0, 0.0, LIMITS) == []
    survivor.receive(Beat(0, -1, ALIVE, 0.0), 110.9)
    (late,) = silent_ranks({0: survivor}, [0], 111.1, 0.0, LIMITS)
    assert late.rank == 0 and 6.0 < late.silent_s < 6.2 and late.alive


def test_a_zero_timeout_turns_heartbeats_off():
    off = Limits(0.0, 10.0, 3.0, 600.0)
    assert silent_ranks({}, [0, 1], 10_000.0, 0.0, off) == []


def test_a_beat_survives_the_wire_and_garbage_is_ignored():
    b = Beat(3, 17, "step", 0.0, generation=2, collectives=(("0", "default_pg", 41), ("1", "undefined", 3)),
             waiting_s=1.5, sections={"forward": 0.25, "collective": 0.5, "step": 1.0})
    assert Beat.decode(b.encode()) == b
    assert Beat.decode(b"[3, 17, \"step\", 0.0, 2]") == Beat(3, 17, "step", 0.0, 2)  # an older rank's beat
    assert Beat.decode(b"not json") is None and Beat.decode(b"[1, 2]") is None


@pytest.mark.parametrize("seqs, front, waiting, behind", [
    ({0: 57, 1: 55, 2: 57, 3: 57}, 57, (0, 2, 3), ((1, 55),)),   # rank 1 never entered #57
    ({0: 57, 1: 57}, None, None, None),                          # everybody entered: no wavefront
    ({0: 9, 1: 8, 2: 8}, 9, (0,), ((1, 8), (2, 8))),             # two ranks behind
])
def test_the_wavefront_names_the_ranks_that_did_not_enter_the_collective_the_others_wait_in(seqs, front, waiting,
                                                                                               behind):
    states = {r: state((beat(r, seqs=(s,)), 100.0)) for r, s in seqs.items()}
    w = wavefront(states, sorted(seqs))
    if front is None:
        assert w is None
        return
    assert (w.group, w.desc, w.seq, w.waiting, w.behind) == ("0", "default_pg", front, waiting, behind)
    text = w.describe({r: f"n{r + 1}" for r in seqs})
    assert f"collective #{front} of group 0 (default_pg)" in text and f"rank {behind[0][0]} (n{behind[0][0] + 1})" in text
    assert w.as_record()["behind"] == {str(r): s for r, s in behind}


def test_the_largest_group_that_disagrees_is_the_one_named():
    def two_groups(r, world, sub):
        return Beat(r, 5, "step", 0.0, collectives=(("0", "default_pg", world), ("3", "replica", sub)))
    states = {0: state((two_groups(0, 10, 4), 1.0)), 1: state((two_groups(1, 9, 4), 1.0)),
              2: state((Beat(2, 5, "step", 0.0, collectives=(("0", "default_pg", 10), ("5", "replica", 2))), 1.0))}
    assert wavefront(states, [0, 1, 2]).group == "0"


def test_the_culprits_are_the_ones_behind_else_the_ones_not_alive_else_everyone():
    states = {0: steady(0, 100.0, alive_at=107.5), 1: steady(1, 100.0, alive_at=107.5),
              2: steady(2, 100.0, alive_at=107.5)}
    silent = silent_ranks(states, [0, 1, 2], 107.5, 0.0, LIMITS)
    assert [s.rank for s in silent] == [0, 1, 2] and all(s.alive for s in silent)
    assert [s.rank for s in culprits(silent)] == [0, 1, 2]  # deadlocked together
    for r, seq in ((0, 12), (1, 11), (2, 12)):
        states[r].receive(Beat(r, -1, ALIVE, 0.0, collectives=(("0", "", seq),)), 107.5)
    front = wavefront(states, [0, 1, 2])
    assert [s.rank for s in culprits(silent, front)] == [1]  # the others wait in #12 for it
    states[2].alive_at = 100.0
    silent = silent_ranks(states, [0, 1, 2], 107.5, 0.0, LIMITS)
    assert [s.rank for s in culprits(silent)] == [2]  # no wavefront: the one no longer alive


def test_a_rank_that_exits_one_heartbeat_and_opens_another_is_watched_again():
    """A survivor of a peer's death closes its session's heartbeat, waits for the driver's word with
    another, and trains on with a third: after its exit beat it is watched again once it beats."""
    s = steady(0, 100.0, alive_at=100.0)
    s.receive(Beat(0, -1, EXIT, 600.0), 101.0)
    assert silent_ranks({0: s}, [0], 200.0, 0.0, LIMITS) == []
    s.receive(Beat(0, 5, "await_restart", 60.0), 102.0)
    assert [x.rank for x in silent_ranks({0: s}, [0], 200.0, 0.0, LIMITS)] == [0]
