from __future__ import annotations

from pathlib import Path

import pytest

from resilient_slurm.health.log_sources import Cursor
from resilient_slurm.health.node_state import NodeState
from resilient_slurm.health.verdict import HistoryEntry

CURSOR = Cursor("file", "/logs/n1.log#42", 1234)


def test_cursors_round_trip_and_runs_are_keyed_by_restart(tmp_path: Path) -> None:
    state = NodeState(str(tmp_path), "n1")
    assert state.node_cursor() is None and state.run_cursor("7", 0) is None
    state.save_node_cursor(CURSOR)
    state.save_run_cursor("7", 0, CURSOR)
    assert state.node_cursor() == CURSOR
    assert state.run_cursor("7", 0) == CURSOR
    assert state.run_cursor("7", 1) is None  # the requeued run does not inherit the first run's start
    state.drop_run_cursor("7", 0)
    state.drop_run_cursor("7", 0)
    assert state.run_cursor("7", 0) is None


def test_nodes_on_one_machine_do_not_share_state(tmp_path: Path) -> None:
    n1, n2 = NodeState(str(tmp_path), "n1"), NodeState(str(tmp_path), "n2")
    n1.save_node_cursor(CURSOR)
    assert n2.node_cursor() is None
    assert (tmp_path / "n1" / "cursor.json").exists() and not (tmp_path / "n2" / "cursor.json").exists()


def test_history_round_trip(tmp_path: Path) -> None:
    state = NodeState(str(tmp_path), "n1")
    entries = [HistoryEntry(13, "0000:3b:00", "7", 1.5), HistoryEntry(63, "", "8", 2.0)]
    state.save_history(entries)
    assert state.history() == entries


@pytest.mark.parametrize("content", [b"", b"{", b"[1, 2]", b'{"source": 1}', b"\xff\xfe"])
def test_torn_or_foreign_files_read_as_absent(tmp_path: Path, content: bytes) -> None:
    state = NodeState(str(tmp_path), "n1")
    for name in ("cursor.json", "history.json"):
        (tmp_path / "n1" / name).write_bytes(content)
    assert state.node_cursor() is None
    assert state.history() == []


def test_history_skips_malformed_entries(tmp_path: Path) -> None:
    state = NodeState(str(tmp_path), "n1")
    (tmp_path / "n1" / "history.json").write_text('[{"xid": 13, "gpu": "", "job": "1", "time_s": 5}, {"xid": "x"}, 3]')
    assert state.history() == [HistoryEntry(13, "", "1", 5.0)]


@pytest.mark.parametrize("node", ["", "../etc", "n1/x", "-n", "a b"])
def test_names_that_would_escape_the_directory_are_refused(tmp_path: Path, node: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm node name"):
        NodeState(str(tmp_path), node)


def test_job_ids_are_checked_too(tmp_path: Path) -> None:
    state = NodeState(str(tmp_path), "n1")
    state.save_run_cursor("123_4", 0, CURSOR)  # array task
    with pytest.raises(ValueError, match="not a Slurm job id"):
        state.run_cursor("../x", 0)
