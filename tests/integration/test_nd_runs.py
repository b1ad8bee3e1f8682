"""The built-in trainer at N-D layouts of 4 gloo ranks, end to end (`python -m resilient_slurm.launch`):

- a run at dp 2 x tp 2 interrupted by SIGUSR1 (an emergency save; SIGTERM takes the same path, and
  tests/integration/test_exact_resume.py sends both) and SIGKILL (a periodic checkpoint), resumed each
  time at the same layout, ends bit-identical to its uninterrupted twin (every chunk of every
  checkpoint file);
- a run that changes layout at every resume, tp 2 x dp 2 -> dp 4 -> one rank -> hsdp 2 x 2, trains
  the same global batches (the data position in every checkpoint) with the same losses and
  validation losses, within 1e-4 relative of the straight run;
- the straight run's hf/ (exported from checkpoints of tensor-parallel chunks) loads in transformers
  with the logits of the run's final weights, to 1e-5;
- an out-of-memory error on one rank of a tensor-parallel group (`fault.oom_at_step`, the error the
  CUDA allocator raises, injected in a layer's forward: no GPU here) is agreed by all 4 ranks before
  any of them enters a TP collective the failed rank would not join; the step is redone at the
  smaller micro-batch, and the losses match the straight run's to 1e-5; then a NaN loss
  (`fault.nan_at_step`) rolls the run back to its checkpoint of TP chunks, past the bad data, and
  the run finishes with no NaN in its record.
The straight run (dp 2 x tp 2, evaluation every 8 steps) is shared. A step at 4 ranks costs about a
second here, so the runs are 24 steps long with a checkpoint every 4."""

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.rundir.identity import load_config
from tests.hf_families import load_theirs
from tests.integration.runs import SMALL, events, finish, interrupt, launch, run_dir
from tests.integration.test_sft import _full

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STEPS = 24
# Validation losses only: greedy decoding for the task metric (eval.task_samples) would take most of
# an evaluation's time here, and no test reads it.
CHANGED = {"data.micro_batch_size": "1", "train.max_steps": str(STEPS), "checkpoint.every_steps": "4",
           "eval.every_steps": "8", "eval.task_samples": "0", "optim.warmup_steps": "5", "tracking.mode": "disabled"}
RUN = [o for o in SMALL if o.partition("=")[0] not in CHANGED] + [f"{k}={v}" for k, v in CHANGED.items()]
TP = ["cluster.ranks=4", "parallel.tp=2"]
LAYOUTS = {"dp4": ["cluster.ranks=4"], "one": ["cluster.ranks=1"],
           "hsdp": ["cluster.ranks=4", "parallel.dp_replicate=2"]}


def go(root: Path, name: str, *extra: str):
    return launch(root, name, *RUN, *extra, base=[])


def metrics(rdir: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (rdir / "metrics.jsonl").read_text().splitlines())}


def chunks(rdir: Path, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of every file of checkpoint `step`, keyed by file and entry."""
    ckpt = rdir / "checkpoints" / f"step_{step:08d}"
    return {f"{f.name}/{k}": v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("straight")
    code, out = finish(go(root, "straight", *TP), timeout=600)
    assert code == ExitCode.DONE, out
    return run_dir(root, "straight")


def test_interrupted_twice_at_dp2_tp2_ends_bit_identical(tmp_path, straight):
    rdir = run_dir(tmp_path, "resumed")
    code, out = interrupt(go(tmp_path, "resumed", *TP), rdir, 6, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(go(tmp_path, "resumed", *TP), rdir, 15, signal.SIGKILL)
    assert code == -signal.SIGKILL
    code, out = finish(go(tmp_path, "resumed", *TP), timeout=600)
    assert code == ExitCode.DONE, out

    ev = events(rdir)
    assert [e.details.signal for e in ev if e.kind is Kind.SIGNAL] == ["SIGUSR1"] * 4
    assert len([e for e in ev if e.kind is Kind.RESUME]) == 2
    a, b = chunks(straight, STEPS), chunks(rdir, STEPS)
    assert a.keys() == b.keys() and any("optimizer" in k for k in a)
    for k in a:
        assert torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), f"{k} differs"


def test_a_run_resharded_at_every_resume_trains_the_same_batches_and_losses(tmp_path, straight):
    rdir = run_dir(tmp_path, "resharded")
    code, out = interrupt(go(tmp_path, "resharded", *TP), rdir, 5, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    for name, stop in (("dp4", 11), ("one", 17)):
        code, out = interrupt(go(tmp_path, "resharded", *LAYOUTS[name]), rdir, stop, signal.SIGUSR1)
        assert code == ExitCode.RESUME, f"{name}: {out}"
    code, out = finish(go(tmp_path, "resharded", *LAYOUTS["hsdp"]), timeout=600)
    assert code == ExitCode.DONE, out

    ev = events(rdir)
    assert [e.details.world_size for e in ev if e.kind is Kind.START] == [4, 4, 1, 4]
    for ckpt in sorted((rdir / "checkpoints").glob("step_*")):
        state = json.loads((ckpt / "train_state.json").read_text())
        assert state["data_state"]["samples_consumed"] == state["step"] * 4  # the same global batches, in order
    want, got = metrics(straight), metrics(rdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, row in want.items():
        for key in ("loss", "val_loss"):
            if key in row:
                assert got[step][key] == pytest.approx(row[key], rel=1e-4), f"step {step}: {key}"
    assert sum("val_loss" in row for row in got.values()) == 3


def test_the_hf_export_of_a_tensor_parallel_run_loads_in_transformers(straight):
    cfg = load_config(straight)
    final = straight / "checkpoints" / f"step_{STEPS:08d}"
    ours = LlamaForCausalLM(cfg.model).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(_full(final, name).bfloat16())  # hf/ holds bf16 weights
    theirs = load_theirs(straight / "hf")
    ids = torch.randint(0, cfg.model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), rtol=1e-5, atol=1e-5)


def test_out_of_memory_and_a_nan_at_dp2_tp2_are_retried_and_rolled_back(tmp_path, straight):
    rdir = run_dir(tmp_path, "faults")
    code, out = finish(go(tmp_path, "faults", *TP, "data.micro_batch_size=2", "fault.oom_at_step=6", "fault.ranks=[1]",
                          "fault.nan_at_step=19", "cluster.collective_timeout_s=60"), timeout=600)
    assert code == ExitCode.DONE, out
    ev = events(rdir)
    (retry,) = [e for e in ev if e.kind is Kind.OOM_RETRY]
    assert retry.step == 6 and retry.details.ranks == [1] and retry.details.new_micro_batch == 1
    (rollback,) = [e for e in ev if e.kind is Kind.ROLLBACK]
    assert rollback.details.anomaly_step == 19 and rollback.step == 16  # the newest checkpoint before it
    want, got = metrics(straight), metrics(rdir)
    assert sorted(got) == list(range(1, STEPS + 1)) and all(row["loss"] == row["loss"] for row in got.values())
    for step in range(1, 17):  # the same steps until the rollback skipped the bad batch's window
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), f"step {step}"
