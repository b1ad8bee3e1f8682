"""Searches with local trials: PBT's exploit and explore on real checkpoints, and ASHA's pause and
promotion through a controller that is killed and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from resilient_slurm.launch.prepare import prepare
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.rundir.meta import read_meta
from resilient_slurm.ledger import ConfigChanged, Exploit, PbtGeneration, Resume, Stop, SweepStarted, select
from resilient_slurm.trainer.optim import lr_factor
from tests.integration.runs import REPO, assert_bit_identical, events, final_tensors, last_step
from tests.integration.sweeps import load, run, start, study_dir, study_events

pytestmark = pytest.mark.slow


def test_a_pbt_exploit_copies_a_checkpoint_and_the_recipient_resumes_with_the_perturbed_values(tmp_path):
    run(tmp_path, "sweep=pbt", "sweep.trials=2", "sweep.interval_steps=20", "sweep.resample_probability=0",
        "sweep.perturb_factors=[0.5]", "sweep.parallel=2", "optim.lr=tag(log,interval(1e-4,3e-3))")
    path = study_dir(tmp_path)
    (generation,) = select(study_events(path), PbtGeneration)
    (x,) = generation.details.exploits
    trials = {t.number: t for t in load(path).trials}
    donor_lr = trials[x["donor"]].params["optim.lr"]
    recipient_lr = trials[x["recipient"]].params["optim.lr"]
    assert x["params"]["optim.lr"] == pytest.approx(donor_lr * 0.5)

    runs = tmp_path / "tiny_sft"
    donor, recipient = runs / f"{path.name}-{x['donor']:03d}", runs / f"{path.name}-{x['recipient']:03d}"
    # The lineage, in the study's ledger and in both members' ledgers.
    for where in (study_events(path), events(donor), events(recipient)):
        (lineage,) = select(where, Exploit)
        assert (lineage.details.donor, lineage.details.recipient, lineage.step) == (donor.name, recipient.name, 20)
    copy = recipient / "checkpoints" / "step_00000020"
    assert lineage.details.checkpoint == str(copy)
    assert (copy / "model.safetensors").read_bytes() == (donor / "checkpoints/step_00000020/model.safetensors").read_bytes()
    assert not list((donor / "checkpoints" / ".pins").iterdir())  # held only while copying

    # The explored value, recorded as the one allowed change, is what the recipient trains with.
    (change,) = select(events(recipient), ConfigChanged)
    assert change.details.changed == {"optim.lr": [recipient_lr, pytest.approx(donor_lr * 0.5)]}
    assert read_meta(recipient)["changes"][0]["changed"] == change.details.changed
    resume = select(events(recipient), Resume)[-1]
    assert (resume.step, resume.details.checkpoint) == (20, str(copy))
    rows = {r["step"]: r for r in map(json.loads, (recipient / "metrics.jsonl").read_text().splitlines())}
    cfg = load_config(recipient)
    assert rows[21]["lr"] == pytest.approx(donor_lr * 0.5 * lr_factor(20, cfg.optim.warmup_steps, 40,
                                                                       cfg.optim.min_lr_ratio))
    assert rows[40]["val_loss"] and (path / "plots" / "lineage.png").stat().st_size > 0
    assert f"g1: {donor.name}@20" in (path / "leaderboard.csv").read_text()


def test_asha_pauses_and_promotes_through_a_controller_killed_mid_way(tmp_path):
    args = ["sweep=asha", "sweep.trials=3", "sweep.min_steps=10", "sweep.reduction_factor=2", "sweep.parallel=2",
            "train.max_steps=20", "fault.step_sleep_s=0.1", "optim.lr=tag(log,interval(3e-4,3e-3))"]
    controller = start(tmp_path, *args)
    runs = tmp_path / "tiny_sft"
    deadline = time.monotonic() + 60
    while not any(last_step(d) >= 3 for d in runs.glob("asha-*")):
        assert time.monotonic() < deadline and controller.poll() is None, controller.stdout.read()
        time.sleep(0.1)
    os.kill(controller.pid, signal.SIGKILL)  # its local trials get SIGTERM, save and stop
    controller.wait()
    out = run(tmp_path, *args)
    path = study_dir(tmp_path)

    assert [e.details.resumed for e in select(study_events(path), SweepStarted)] == [False, True]
    states = sorted(t.state.name for t in load(path).trials)
    assert states == ["COMPLETE", "PRUNED", "PRUNED"], out
    trial_dirs = sorted(runs.glob(f"{path.name}-*"))
    assert [d.name[-3:] for d in trial_dirs] == ["000", "001", "002"]
    interrupted = [d for d in trial_dirs if select(events(d), Stop)]
    assert interrupted and all(select(events(d), Resume) for d in interrupted)
    # The promoted trial paused at 10 (and was stopped on the way): it still ends bit-identical to
    # the same config trained straight through.
    (best,) = [d for d in trial_dirs if (d / "checkpoints" / "step_00000020").exists()]
    cfg = load_config(best)
    cfg.run.name, cfg.train.pause_at_step = "reference", 0
    reference, _ = prepare(cfg, [])
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.supervise.local", str(reference)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_bit_identical(final_tensors(reference, 20), final_tensors(best, 20))
