"""One hang, one record: the ranks' watchdogs reach their limit together, and only the first to
claim the run's hang marker records it (session.watchdog.claim_hang); the others dump as peers,
once per hang."""

import os
import time

from resilient_slurm.config import MonitorConfig
from resilient_slurm.ledger import EventLog, Kind, read_events
from resilient_slurm.monitor.hang_dumps import HANG_MARKER
from resilient_slurm.session.watchdog import Watchdog, claim_hang


def test_the_first_claim_since_the_start_wins_and_the_others_see_a_peers(tmp_path):
    started = time.time() - 1
    assert claim_hang(tmp_path, started)
    assert not claim_hang(tmp_path, started)  # a second rank of the same start
    assert (tmp_path / HANG_MARKER).exists()


def test_an_earlier_starts_marker_is_replaced_and_claimed(tmp_path):
    marker = tmp_path / HANG_MARKER
    marker.touch()
    os.utime(marker, (1000.0, 1000.0))  # left by a start that hung long ago
    assert claim_hang(tmp_path, time.time() - 1)
    assert marker.stat().st_mtime > 1000.0


def test_a_rank_that_trains_on_after_a_peers_hang_dumps_its_stacks_once_per_hang(tmp_path):
    """With replica groups the other group's ranks go on after a hang: each found hang (a touch of
    the marker) gets one dump of their stacks, not one at every later step."""
    events = EventLog(tmp_path / "events.jsonl")
    dog = Watchdog(MonitorConfig(), tmp_path, events, rank=0, on_hang=lambda s, r: None, exit_code=1)
    dog.look()
    assert not list(tmp_path.glob("hang-rank0-*.txt"))  # no marker, nothing to answer
    marker = tmp_path / HANG_MARKER
    marker.touch()
    os.utime(marker, (dog.started_at + 1, dog.started_at + 1))  # a peer's hang, found after this start
    for step in range(1, 4):
        dog.beat(step, 0.01)
        dog.look()
    os.utime(marker, (dog.started_at + 2, dog.started_at + 2))  # a second hang found
    dog.beat(4, 0.01)
    dog.look()
    dog.beat(5, 0.01)
    dog.look()
    assert sorted(p.name for p in tmp_path.glob("hang-rank0-*.txt")) == ["hang-rank0-step1.txt", "hang-rank0-step4.txt"]
    assert [e.step for e in read_events(tmp_path / "events.jsonl") if e.kind is Kind.STACKS_DUMPED] == [1, 4]
