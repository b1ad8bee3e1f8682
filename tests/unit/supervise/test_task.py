"""The Slurm task's own decisions: who acts on a decision, and how the exclude list is kept. scontrol
is faked here (no cluster): `requeue` and `set_excluded_nodes` are the adapter's two calls."""

import pytest

from resilient_slurm.config import HealthConfig
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import EventLog, Kind, parse, read_events
from resilient_slurm.recovery import Action, Decision, failures_without_progress, restart_cause
from resilient_slurm.slurm import scontrol
from resilient_slurm.supervise import task


@pytest.fixture
def fake_scontrol(monkeypatch):
    calls = []
    monkeypatch.setattr(scontrol, "requeue", lambda job: calls.append(("requeue", job)) or (True, ""))
    monkeypatch.setattr(scontrol, "set_excluded_nodes",
                        lambda job, nodes: calls.append(("exclude", job, nodes)) or (True, ""))
    return calls


def test_the_exclude_list_keeps_a_node_for_health_exclude_ttl_h(tmp_path, fake_scontrol):
    assert HealthConfig().exclude_ttl_h == 24.0  # the default; the job must use the configured one
    events = EventLog(tmp_path / "events.jsonl")
    decision = Decision(Action.REQUEUE, "failures follow node n2", exclude_nodes=("n2",))
    task.requeue("7", decision, 12, str(tmp_path / "exclude.json"), exclude_ttl_s=2 * 3600.0, events=events)
    entry = exclude_list.load(str(tmp_path / "exclude.json"))["n2"]
    assert entry.expires_s - entry.added_s == pytest.approx(2 * 3600.0)
    assert fake_scontrol == [("requeue", "7"), ("exclude", "7", ["n2"])]
    (requeue,) = read_events(tmp_path / "events.jsonl")
    assert requeue.kind is Kind.REQUEUE and requeue.details.exclude == ["n2"] and requeue.details.exclude_ok


def test_each_start_in_one_allocation_has_its_own_claim(tmp_path):
    # two starts inside one allocation (job 7, not requeued): job steps 0 and 1
    assert task._claim(tmp_path, ("7", 0, 0)) and not task._claim(tmp_path, ("7", 0, 0))
    assert task._claim(tmp_path, ("7", 0, 1)), "a second start in the same allocation must be able to act"
    assert task._claim(tmp_path, ("7", 1, 0))  # after a requeue


def ev(kind, step, job_step, **kw):
    return parse({"event": kind, "step": step, "rank": 0, "job_id": "7", "restart": 0, "job_step": job_step, **kw})


def test_two_failed_starts_in_one_allocation_are_two_failures():
    history = [ev("start", 0, 0), ev("crash", 12, 0, error="RuntimeError: a"),
               ev("start", 0, 1), ev("crash", 12, 1, error="RuntimeError: a")]
    assert failures_without_progress(history) == 2
    assert restart_cause(history, ("7", 0, 1)) == "crashed at step 12: RuntimeError: a"
