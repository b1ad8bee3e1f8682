"""The ledger's catalog: every kind has its typed fields, what is written reads back exactly, and the
ledgers written before the catalog existed still read."""

import dataclasses
import json
from pathlib import Path

import pytest

from resilient_slurm import ledger
from resilient_slurm.ledger import (
    CATALOG,
    EventLog,
    Kind,
    parse,
    read_events,
    read_new_events,
    select,
)
from resilient_slurm.recovery import Action, decide

GOLDEN = Path(__file__).parent / "golden" / "ledger_before_typing.jsonl"


def test_every_kind_has_its_fields_in_the_catalog():
    assert set(CATALOG) == set(Kind)
    for kind, cls in CATALOG.items():
        assert cls.KIND is kind and dataclasses.is_dataclass(cls)


def sample(cls):
    """A value for every field of `cls`, of the field's type."""
    values = {"str": "x", "int": 3, "float": 1.5, "bool": True, "list[str]": ["a"], "list[int]": [1, 2],
              "list[float]": [1.0], "dict[str, Any]": {"k": 1},
              "list[list[Any]]": [[1, 2.5]], "list[dict[str, Any]]": [{"k": 1}],
              "list[dict[str, float]]": [{"rss_bytes": 2.0}], "dict[str, float]": {"tiny_mmlu/acc": 0.5}}
    return cls(**{f.name: values[str(f.type).split(" | ")[0]] for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", sorted(CATALOG.values(), key=lambda c: c.KIND.value), ids=lambda c: c.KIND.value)
def test_what_is_written_reads_back_exactly(tmp_path, cls):
    log = EventLog(tmp_path / "events.jsonl", rank=1, context={"job_id": "7", "restart": 2, "job_step": 1, "node": "n3"})
    details = sample(cls)
    written = log.emit(details, 12)
    (read,) = read_events(tmp_path / "events.jsonl")
    assert read == written and read.details == details and read.kind is cls.KIND
    assert (read.step, read.rank, read.job_id, read.restart, read.job_step, read.node) == (12, 1, "7", 2, 1, "n3")


def test_optional_fields_left_unset_are_not_written(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.emit(ledger.Requeue(reason="r", ok=True), 3)
    line = json.loads((tmp_path / "events.jsonl").read_text())
    assert "exclude" not in line and "error" not in line and line["ok"] is True


def test_unknown_kinds_and_missing_fields_still_read():
    e = parse({"event": "from_a_newer_version", "step": 1, "rank": 0, "what": 1})
    assert e.kind is Kind.UNKNOWN and e.record["what"] == 1
    torn = parse({"event": "save", "step": 5, "rank": 0, "reason": "periodic"})
    assert torn.details.reason == "periodic" and torn.details.bytes is None


def test_ledgers_written_before_the_catalog_read_with_every_field_known():
    events = read_events(GOLDEN)
    assert events and not [e for e in events if e.kind is Kind.UNKNOWN]
    for e in events:
        names = {f.name for f in dataclasses.fields(e.details)}
        header = {"time", "event", "step", "rank", "job_id", "restart", "job_step", "node"}
        unknown = set(e.record) - names - header
        assert not unknown, f"{e.kind}: fields the catalog lacks: {unknown}"
        # every field the catalog requires is in the old line (none read as a torn line's None)
        required = {f.name for f in dataclasses.fields(e.details)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        assert required <= set(e.record), f"{e.kind}: the old line lacks {required - set(e.record)}"
    # the old Slurm attempts still drive today's decision: the same crash twice, budget 1
    job = [e for e in events if e.job_id == "21"]
    assert decide(1, None, "InjectedFault", job, max_restarts=1).action is Action.GIVE_UP
    assert [s.step for s in select(events, ledger.Save) if s.details.reason == "emergency"] == [201]


def test_a_ledger_is_read_on_from_where_the_last_read_ended(tmp_path):
    path = tmp_path / "events.jsonl"
    assert read_new_events(path, 0) == ([], 0)
    EventLog(path).emit(ledger.Finish(tokens_seen=1), 3)
    (first,), at = read_new_events(path, 0)
    with open(path, "ab") as f:
        f.write(b'{"time": "2026-12-01T00:00:00Z", "event": "fin')  # a line still being written
    assert first.step == 3 and read_new_events(path, at) == ([], at)
    with open(path, "ab") as f:
        f.write(b'ish", "step": 4, "rank": 0}\n')
    (second,), _ = read_new_events(path, at)
    assert second.step == 4 and second.kind.value == "finish"
