"""Relaunching: a finished run is not run again (no export, no restart counted); a run that never
trained (its data check failed) may be relaunched with its config changed, and the change is recorded."""

import json

import pytest

from resilient_slurm.analysis.summary import load, summarize
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import events, finish, launch, run_dir

pytestmark = pytest.mark.slow


def test_relaunching_a_finished_run_says_so_and_does_nothing(tmp_path):
    rdir = run_dir(tmp_path, "f")
    code, out = finish(launch(tmp_path, "f", "train.max_steps=30"))
    assert code == ExitCode.DONE, out
    before = {p: p.stat().st_mtime_ns for p in (rdir / "events.jsonl", rdir / "record.jsonl", rdir / "hf")}
    exported = (rdir / "hf" / "model.safetensors").stat().st_mtime_ns
    code, out = finish(launch(tmp_path, "f", "train.max_steps=30", "cluster.ranks=2"))
    assert code == ExitCode.DONE
    assert out == (f"resilient_slurm: run {rdir} already finished; nothing to do (choose a new run.name, or add "
                   f"run.fork=true with a changed config, to train again)\n")
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert (rdir / "hf" / "model.safetensors").stat().st_mtime_ns == exported
    acc = summarize(load(rdir)).acc
    assert acc.restarts == 0 and acc.finished


def test_a_run_whose_data_check_failed_is_relaunched_with_the_data_fixed(tmp_path):
    rdir = run_dir(tmp_path, "d")
    missing = tmp_path / "chat.jsonl"
    code, out = finish(launch(tmp_path, "d", "train.max_steps=20", f"data.path={missing}"))
    assert code == ExitCode.CONFIG, out
    assert str(missing) in out and "Traceback" not in out
    code, out = finish(launch(tmp_path, "d", "train.max_steps=20"))  # the package's own chat set
    assert code == ExitCode.DONE, out
    (change,) = json.loads((rdir / "run.json").read_text())["changes"]
    assert change["changed"] == {"data.path": [str(missing), "asset:tiny_chat/chat.jsonl"]}
    assert [e.details.changed for e in events(rdir) if e.kind is Kind.CONFIG_CHANGED] == [change["changed"]]
