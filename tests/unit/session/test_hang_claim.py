"""One hang, one record: the ranks' watchdogs reach their limit together, and only the first to
claim the run's hang marker records it (session.watchdog.claim_hang); the others dump as peers."""

import os
import time

from resilient_slurm.monitor.hang_dumps import HANG_MARKER
from resilient_slurm.session.watchdog import claim_hang


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
