"""Pretraining on the token mixture (tiny_pretrain), in real processes: interrupted by SIGUSR1, SIGTERM
and SIGKILL on one rank and resumed bit-identical (2 ranks: tests/integration/test_exact_resume.py,
the same loop on chat data); resumed at other data-parallel sizes
(2 -> 1 -> 4 ranks, same global batch) on exactly the same global batches, so every step's loss
matches the uninterrupted run; a new data phase from a checkpoint; a source used up with
data.on_exhausted=stop. Nothing is faked: torch with gloo, the generated corpus tokenized for real."""

import json
import signal

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, interrupt, launch

pytestmark = pytest.mark.slow

PRETRAIN = [
    "+experiment=tiny_pretrain", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
    "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64", "data.global_batch_size=4",
    "data.micro_batch_size=1", "optim.warmup_steps=10", "train.log_every_steps=50", "train.max_steps=120",
    "checkpoint.every_steps=25", "eval.every_steps=0", "tracking.mode=disabled",
]


# Shorter than PRETRAIN's 120 steps (which tests/slurm shares): enough for the interrupts, each
# between checkpoints, and for the resumes at other world sizes.
STEPS = 60
SHORT = [f"train.max_steps={STEPS}", "checkpoint.every_steps=10"]


def start(root, name, *overrides):
    return launch(root, name, *overrides, base=PRETRAIN)


def rdir(root, name):
    return root / "tiny_pretrain" / name


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run at `ranks`, launched once for the tests that compare against it."""
    runs = {}

    def at(ranks):
        if ranks not in runs:
            root = tmp_path_factory.mktemp(f"straight{ranks}")
            code, out = finish(start(root, "straight", f"cluster.ranks={ranks}", *SHORT))
            assert code == ExitCode.DONE, out
            runs[ranks] = rdir(root, "straight")
        return runs[ranks]
    return at


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_pretraining_interrupted_three_ways_ends_bit_identical(tmp_path, straight):
    extra = ["cluster.ranks=1", *SHORT]
    run = rdir(tmp_path, "resumed")
    for at, signum in ((12, signal.SIGUSR1), (27, signal.SIGTERM), (45, signal.SIGKILL)):
        code, out = interrupt(start(tmp_path, "resumed", *extra), run, at, signum)
        assert code == (-signal.SIGKILL if signum == signal.SIGKILL else ExitCode.RESUME), out
    code, out = finish(start(tmp_path, "resumed", *extra))
    assert code == ExitCode.DONE, out
    assert_bit_identical(final_tensors(straight(1), STEPS), final_tensors(run, STEPS))
    ev = events(run)
    stops = [e for e in ev if e.kind is Kind.STOP]
    assert len(stops) == 2 and all(set(s.details.data) == {"prose", "math"} for s in stops)
    assert all(s.details.data["prose"]["file"].endswith("prose.bin") for s in stops)  # the current shard
    assert [r["step"] for r in rows(run)] == list(range(1, STEPS + 1))


def test_other_world_sizes_feed_the_same_global_batches(tmp_path, straight):
    run = rdir(tmp_path, "resized")
    code, out = interrupt(start(tmp_path, "resized", "cluster.ranks=2", *SHORT), run, 20, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(start(tmp_path, "resized", "cluster.ranks=1", *SHORT), run, 40, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = finish(start(tmp_path, "resized", "cluster.ranks=4", *SHORT))
    assert code == ExitCode.DONE, out
    ref, got = rows(straight(1)), rows(run)
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, STEPS + 1))
    for a, b in zip(ref, got):
        # The same windows in every global batch: each source's trained tokens agree exactly ...
        assert {k: v for k, v in a.items() if k.startswith("data/")} == {k: v for k, v in b.items()
                                                                        if k.startswith("data/")}, a["step"]
        # ... and the loss to float tolerance (sums over ranks and micro-batches in another order).
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-5), a["step"]
    resumes = [e for e in events(run) if e.kind is Kind.RESUME]
    assert [r.details.saved_world_size for r in resumes] == [2, 1]


def test_a_new_data_phase_begins_at_the_checkpoint_it_resumes(tmp_path):
    run = rdir(tmp_path, "annealed")
    code, out = interrupt(start(tmp_path, "annealed"), run, 50, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    anneal = ["data.phase=anneal", "data.sources=[{name:prose,path:'asset:tiny_pretrain/prose',weight:0.2},"
              "{name:math,path:'asset:tiny_pretrain/math',weight:0.8}]"]
    code, out = finish(start(tmp_path, "annealed", *anneal))
    assert code == ExitCode.DONE, out
    ev = events(run)
    (phase,) = [e for e in ev if e.kind is Kind.DATA_PHASE]
    stop = next(e for e in ev if e.kind is Kind.STOP)
    assert phase.details.phase == "anneal" and phase.step == stop.step
    assert phase.details.sources == {"prose": 0.2, "math": 0.8}
    assert [e for e in ev if e.kind is Kind.CONFIG_CHANGED]
    got = rows(run)
    before, after = got[stop.step - 1], got[-1]
    grown = {s: after[f"data/{s}/tokens"] - before[f"data/{s}/tokens"] for s in ("prose", "math")}
    assert grown["math"] / (grown["math"] + grown["prose"]) == pytest.approx(0.8, abs=0.05)


def test_a_used_up_source_stops_the_run_with_data_on_exhausted_stop(tmp_path):
    run = rdir(tmp_path, "short")
    # At 64 tokens a window, prose has about 4,500 training windows at weight 0.7 (used up after about
    # 6,500 sequences), math about 2,200 at 0.3 (about 7,500): prose runs out first, long before 20,000 steps.
    code, out = finish(start(tmp_path, "short", "data.on_exhausted=stop", "train.max_steps=20000",
                             "data.global_batch_size=16", "data.micro_batch_size=16", "checkpoint.every_steps=0",
                             "checkpoint.every_minutes=0"), timeout=600)
    assert code == ExitCode.DONE, out
    ev = events(run)
    (used,) = [e for e in ev if e.kind is Kind.SOURCE_EXHAUSTED]
    assert used.details.source == "prose" and ev[-1].kind is Kind.FINISH and ev[-1].step == used.step < 20000
