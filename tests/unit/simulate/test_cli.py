import json

import pytest

from resilient_slurm.simulate.__main__ import main

SMALL = ["--gpus", "800", "--days", "1", "--gpu-mtbf-h", "2400", "--seeds", "2"]


def test_json_is_one_object_with_goodput_and_the_breakdown(capsys):
    assert main([*SMALL, "--strategy", "spares", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["goodput"] < 1 and out["goodput_p10"] <= out["goodput_p50"] <= out["goodput_p90"]
    assert out["strategy"] == "spares" and out["seeds"] == 2
    assert out["scenario"]["gpus"] == 800 and out["scenario"]["mix"]["gpu"] == pytest.approx(268 / 419, abs=1e-4)
    lost = sum(out["lost_gpu_h_by_cause"].values())
    assert lost == pytest.approx(out["lost_gpu_h"], abs=1.0)
    assert out["lost_gpu_h"] == pytest.approx(out["paid_gpu_h"] * (1 - out["goodput"]), rel=1e-3)
    assert out["dollars"]["lost_low"] < out["dollars"]["lost"] < out["dollars"]["lost_high"]


def test_compare_covers_every_strategy(capsys):
    assert main([*SMALL, "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["strategies"]) == ["none", "fixed", "young_daly", "async", "spares", "elastic", "heartbeat",
                                      "memory", "inprocess", "replica_ft", "stragglers", "sdc", "topup"]
    assert out["goodput"] == out["strategies"]["young_daly"]["goodput"]
    assert main([*SMALL, "--compare"]) == 0
    table = capsys.readouterr().out
    assert "| elastic |" in table and "the seed's recipe" in table


def test_from_bench_takes_measured_costs_and_options_still_win(tmp_path, capsys):
    bench = tmp_path / "ckpt.json"
    bench.write_text(json.dumps({"save_s": 12.5, "blocking_s": 0.4, "lost_s": 0.9, "load_s": 7.0, "bytes": 2e9}))
    assert main([*SMALL, "--from-bench", str(bench), "--load-s", "9", "--json"]) == 0
    scenario = json.loads(capsys.readouterr().out)["scenario"]
    assert (scenario["save_s"], scenario["blocking_s"], scenario["load_s"]) == (12.5, 0.9, 9.0)


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "1001"], "--gpus 1001: must be a positive multiple of --gpus-per-node 8"),
    (["--blocking-s", "40"], "--blocking-s 40: an async save cannot block longer than --save-s 30"),
    (["--mix", "gpu=1,disk=1"], "--mix: unknown component(s) disk"),
    (["--from-bench", "/nonexistent.json"], "--from-bench /nonexistent.json: cannot read it"),
])
def test_bad_input_is_one_line_naming_the_option(argv, message, capsys):
    assert main([*SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "timeline.png"
    assert main([*SMALL, "--seeds", "1", "--strategy", "elastic", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "goodput (of the GPU-hours paid" in out and "ETTR (MegaScale" in out
