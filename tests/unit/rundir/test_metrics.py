"""metrics.jsonl keeps the surviving timeline; the rolled-back rows move to metrics-lost.jsonl."""

import json

from resilient_slurm.rundir.metrics import MetricsFile, read_metrics


def test_truncate_moves_the_lost_steps_aside(tmp_path):
    m = MetricsFile(tmp_path / "metrics.jsonl")
    for step in range(1, 8):
        m.append({"step": step, "loss": float(step)})
    m.truncate_after(4)
    assert [r["step"] for r in read_metrics(m.path)] == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics-lost.jsonl")] == [5, 6, 7]
    for step in range(5, 7):
        m.append({"step": step, "loss": -float(step)})
    m.truncate_after(5)  # a second fault: its lost step is counted again, as work lost twice
    assert [r["step"] for r in read_metrics(m.lost_path)] == [5, 6, 7, 6]
    assert all("time" in r for r in read_metrics(m.path))


def test_a_torn_line_is_dropped_and_nothing_is_lost_without_rollback(tmp_path):
    m = MetricsFile(tmp_path / "metrics.jsonl")
    m.append({"step": 1})
    with open(m.path, "a") as f:
        f.write('{"step": 2, "lo')
    m.truncate_after(1)
    assert [r["step"] for r in read_metrics(m.path)] == [1] and not m.lost_path.exists()
    assert json.loads(m.path.read_text())["step"] == 1
    assert read_metrics(tmp_path / "absent.jsonl") == []
