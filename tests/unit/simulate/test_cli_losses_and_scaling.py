"""The command line's issue 23 parts: the loss table across the mechanisms, ETTR beside goodput,
where each cost came from, and measured costs scaled with --scale-to."""

import json

import pytest

from resilient_slurm.simulate.__main__ import main
from resilient_slurm.simulate.scenario import STEPS

SMALL = ["--gpus", "800", "--days", "1", "--gpu-mtbf-h", "1600", "--seeds", "1"]


def test_losses_prints_each_loss_for_spares_and_each_mechanism_added(capsys):
    assert main([*SMALL, "--losses", "--strategy", "inprocess"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| lost to |"))
    assert header == "| lost to | " + " | ".join(STEPS) + " |"
    assert "| **goodput** |" in out and "| ETTR (spares excluded) |" in out
    assert "| heartbeat_s | 6 s | configured: monitor.heartbeat_timeout_s" in out


def test_json_has_ettr_the_sources_and_the_restart_paths(capsys):
    assert main([*SMALL, "--strategy", "inprocess", "--json", "--teardown-s", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["goodput"] == pytest.approx(out["ettr"] * out["job_share"], abs=1e-4)
    assert out["sources"]["teardown_s"] == "given: --teardown-s" and out["scenario"]["teardown_s"] == 2.0
    assert out["sources"]["rendezvous_s"].startswith("published: NVRx")
    assert set(out["restart_paths"]) <= {"in process", "step restart (hang)", "step restart (CUDA error)"}
    assert out["memory_saves"] > 0 and "load_memory" in out["lost_gpu_h_by_cause"]


def test_measured_costs_are_scaled_to_the_target_and_say_so(tmp_path, capsys):
    ckpt = tmp_path / "checkpoint.json"
    ckpt.write_text(json.dumps({"bytes": 550e6, "save_s": 1.0, "blocking_s": 0.08, "lost_s": 0.2, "load_s": 1.2,
                                "memory_blocking_s": 0.06, "memory_save_s": 0.3, "memory_load_s": 0.07,
                                "buddy_load_s": 0.09}))
    restart = tmp_path / "restart.json"
    restart.write_text(json.dumps({"ranks": 2, "steady_step_s": 0.05, "heartbeat_timeout_s": 10.0,
                                   "heartbeat_detect_s": 10.8, "inprocess_teardown_s": 0.1,
                                   "inprocess_rendezvous_s": 0.05, "inprocess_process_start_s": 4.0}))
    args = [*SMALL, "--strategy", "inprocess", "--json", "--from-bench", str(ckpt), "--from-bench", str(restart)]
    assert main(args) == 0
    measured = json.loads(capsys.readouterr().out)
    assert measured["scenario"]["memory_blocking_s"] == 0.06
    assert measured["sources"]["memory_blocking_s"] == f"measured: {ckpt}"
    assert main([*args, "--scale-to", "8b-h100"]) == 0
    scaled = json.loads(capsys.readouterr().out)
    s, sources = scaled["scenario"], scaled["sources"]
    assert s["heartbeat_s"] == pytest.approx(6.8)  # the target's 6 s timeout, the bench's overshoot kept
    assert s["memory_blocking_s"] == pytest.approx(0.06 - 550e6 / 11e9 + s["ckpt_bytes"] / 64e9)
    assert s["ckpt_bytes"] == pytest.approx(8.03e9 * 12 / 800)
    assert s["replacement_start_s"] == 4.0  # one node's processes: as measured
    assert sources["memory_blocking_s"].startswith(f"scaled to 8b-h100 from {ckpt}: ")
    assert sources["save_s"].startswith("scaled") and sources["restart_s"] == "assumed (the seed)"


@pytest.mark.parametrize("argv, message", [
    (["--scale-to", "8b-h100"], "--scale-to 8b-h100: nothing measured to scale"),
    (["--memory-blocking-s", "20"], "--memory-blocking-s 20: a memory-tier save cannot block longer than"),
    (["--teardown-s", "-1"], "--teardown-s: must be >= 0"),
])
def test_bad_issue23_input_is_one_line_naming_the_option(argv, message, capsys):
    assert main([*SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
