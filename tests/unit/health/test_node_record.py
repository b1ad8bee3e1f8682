"""The cluster's node record across jobs: which nodes its policy keeps out of new jobs (pure table),
and the file many writers append to at once."""

import multiprocessing
import json

import pytest

from resilient_slurm.health import node_record
from resilient_slurm.health.node_policy import CLEARED, HANG, SDC, STRAGGLER, XID, Mark, excluded, parse_limits

DAY = 86400.0
NOW = 100 * DAY
LIMITS = {XID: 2, SDC: 2, STRAGGLER: 3, HANG: 3}


def marks(*spec):
    """(node, kind, days ago)"""
    return [Mark(node, kind, NOW - days * DAY) for node, kind, days in spec]


@pytest.mark.parametrize("record, out", [
    ([], {}),
    # 3 straggler verdicts within 7 days keep the node out; 2 do not
    (marks(("n1", STRAGGLER, 1), ("n1", STRAGGLER, 2), ("n1", STRAGGLER, 6)), {"n1": "3 straggler"}),
    (marks(("n1", STRAGGLER, 1), ("n1", STRAGGLER, 2)), {}),
    # the third is older than the window: aged out, the node is back
    (marks(("n1", STRAGGLER, 1), ("n1", STRAGGLER, 2), ("n1", STRAGGLER, 8)), {}),
    # 2 SDCs are enough; kinds do not add up
    (marks(("n2", SDC, 0.5), ("n2", SDC, 3)), {"n2": "2 sdc"}),
    (marks(("n2", SDC, 0.5), ("n2", STRAGGLER, 3), ("n2", HANG, 1), ("n2", XID, 2)), {}),
    # a person cleared the node after its repair: the marks before it no longer count
    (marks(("n3", HANG, 3), ("n3", HANG, 2), ("n3", CLEARED, 1.5), ("n3", HANG, 1)), {}),
    (marks(("n3", CLEARED, 4), ("n3", HANG, 3), ("n3", HANG, 2), ("n3", HANG, 1)), {"n3": "3 hang"}),
    # two nodes, each judged on its own
    (marks(("a", XID, 1), ("a", XID, 2), ("b", XID, 1)), {"a": "2 xid"}),
])
def test_the_policy_keeps_out_the_nodes_whose_marks_reach_a_limit_in_the_window(record, out):
    got = excluded(record, 7 * DAY, LIMITS, NOW)
    assert {n: r.split(": ")[1].split(" in ")[0] for n, r in got.items()} == out
    assert all(r.startswith("node record: ") and r.endswith("in 7.0 days") for r in got.values())


def test_a_zero_limit_never_excludes():
    assert excluded(marks(*[("n1", STRAGGLER, d) for d in range(5)]), 7 * DAY, {STRAGGLER: 0}, NOW) == {}


@pytest.mark.parametrize("spec, window_s, limits", [
    ("", 7 * DAY, {}),
    ("window_h=24,sdc=2,straggler=3", DAY, {SDC: 2, STRAGGLER: 3}),
])
def test_policy_spelling(spec, window_s, limits):
    assert parse_limits(spec) == (window_s, limits)


@pytest.mark.parametrize("spec", ["sdc", "bogus=2", "window_h=0", "hang=-1", "cleared=1"])
def test_a_bad_policy_names_the_part(spec):
    with pytest.raises(ValueError):
        parse_limits(spec)


def _append_many(path, node, n):
    for i in range(n):
        node_record.append(path, Mark(node, STRAGGLER, NOW + i, job_id=node, detail={"i": i, "pad": "x" * 500}))


def test_many_writers_lose_no_line_and_a_torn_line_is_skipped(tmp_path):
    path = str(tmp_path / "nodes.jsonl")
    procs = [multiprocessing.Process(target=_append_many, args=(path, f"n{w}", 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with open(path, "a") as f:
        f.write('{"node": "n9", "kind": "hang", "at": 1')  # a writer that died mid-line
    record = node_record.read(path)
    assert len(record) == 200 and {m.node for m in record} == {"n0", "n1", "n2", "n3"}
    assert all(sorted(m.detail["i"] for m in record if m.node == n) == list(range(50)) for n in ("n0", "n3"))
    assert json.loads(open(path).readline())["time"].endswith("Z")
    assert node_record.read(str(tmp_path / "missing.jsonl")) == []
    with pytest.raises(ValueError):
        node_record.append(path, Mark("n1", "bitflip", NOW))
