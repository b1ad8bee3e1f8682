from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from resilient_slurm.health import exclude_list
from resilient_slurm.health.exclude_list import (
    ExcludeEntry,
    ExcludeListError,
    active,
    add,
    clear,
    exclude_value,
    load,
)

NOW = 1_800_000_000.0


def test_add_load_render(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    assert load(path) == {} and exclude_value(load(path), NOW) == ""
    add(path, "n3", reason="Xid 79 on 0000:3b:00", now=NOW, xid=79, job_id="42", ttl_s=3600)
    add(path, "n1", reason="preflight\nrefused", now=NOW, ttl_s=3600)
    entries = load(path)
    assert entries["n3"] == ExcludeEntry("n3", "Xid 79 on 0000:3b:00", 79, "42", NOW, NOW + 3600)
    assert entries["n1"].reason == "preflight refused"  # one line, whatever the caller passed
    assert exclude_value(entries, NOW) == "n1,n3"
    raw = json.loads(Path(path).read_text())
    assert raw["version"] == 1 and set(raw["nodes"]) == {"n1", "n3"}


def test_adding_a_node_again_replaces_its_entry(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    add(path, "n1", reason="first", now=NOW, ttl_s=60)
    add(path, "n1", reason="second", now=NOW + 10, xid=48, ttl_s=60)
    [entry] = load(path).values()
    assert (entry.reason, entry.xid, entry.expires_s) == ("second", 48, NOW + 70)


def test_entries_expire_and_writes_drop_them(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    add(path, "n1", reason="short", now=NOW, ttl_s=60)
    add(path, "n2", reason="long", now=NOW, ttl_s=3600)
    assert exclude_value(load(path), NOW + 59) == "n1,n2"
    assert exclude_value(load(path), NOW + 60) == "n2"
    assert [e.node for e in active(load(path), NOW + 60)] == ["n2"]
    add(path, "n3", reason="later", now=NOW + 61, ttl_s=60)
    assert set(load(path)) == {"n2", "n3"}


def test_clear_one_or_all(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    for node in ("n1", "n2", "n3"):
        add(path, node, reason="r", now=NOW, ttl_s=60)
    assert clear(path, ["n2", "n9"], NOW) == ["n2"]
    assert exclude_value(load(path), NOW) == "n1,n3"
    assert clear(path, None, NOW) == ["n1", "n3"]
    assert load(path) == {}
    assert clear(str(tmp_path / "none.json"), None, NOW) == []


@pytest.mark.parametrize("node", ["n1,n2", "", "n 1", "../n1", "n1\n"])
def test_names_that_would_break_the_exclude_value_are_refused(tmp_path: Path, node: str) -> None:
    with pytest.raises(ExcludeListError, match="not a Slurm node name"):
        add(str(tmp_path / "exclude.json"), node, reason="r", now=NOW)


@pytest.mark.parametrize("content", ["{", "[]", '{"nodes": []}', '{"nodes": {"n1": {"reason": "r"}}}'])
def test_a_damaged_file_is_reported_and_left_alone(tmp_path: Path, content: str) -> None:
    path = tmp_path / "exclude.json"
    path.write_text(content)
    with pytest.raises(ExcludeListError, match="fix or remove it"):
        add(str(path), "n1", reason="r", now=NOW)
    assert path.read_text() == content


WRITES_PER_PROCESS = 150


def _writer(path: str, prefix: str, start: float) -> None:
    while time.time() < start:  # both writers leave the gate at the same moment
        pass
    for i in range(WRITES_PER_PROCESS):
        add(path, f"{prefix}{i}", reason=f"{prefix} {i}", now=time.time(), ttl_s=3600)


def _reader(path: str, stop: multiprocessing.synchronize.Event, result: multiprocessing.Queue) -> None:
    reads, failures = 0, []
    while not stop.is_set():
        try:
            load(path)
            reads += 1
        except ExcludeListError as exc:
            failures.append(str(exc))
    result.put((reads, failures))


def test_two_processes_adding_at_once_lose_nothing_and_the_file_always_parses(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    ctx = multiprocessing.get_context("fork")
    start = time.time() + 0.5
    writers = [ctx.Process(target=_writer, args=(path, prefix, start)) for prefix in ("a", "b")]
    stop, result = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(path, stop, result))
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    stop.set()
    reads, failures = result.get(timeout=30)
    reader.join(10)
    assert failures == []
    assert reads > 0
    entries = load(path)
    assert set(entries) == {f"{p}{i}" for p in ("a", "b") for i in range(WRITES_PER_PROCESS)}
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def test_a_stuck_lock_holder_times_out_instead_of_hanging(tmp_path: Path) -> None:
    path = str(tmp_path / "exclude.json")
    with exclude_list.locked(path + ".lock"):
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()

        def try_lock() -> None:
            try:
                with exclude_list.locked(path + ".lock", timeout_s=0.2):
                    queue.put("got it")
            except TimeoutError as exc:
                queue.put(str(exc))

        child = ctx.Process(target=try_lock)
        child.start()
        child.join(10)
        assert queue.get(timeout=5).endswith("still held after 0.2 s")
