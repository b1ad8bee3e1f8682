"""Stragglers from every rank's step sections: compute without the collective waits, against the
others' median, on consecutive steps."""

import pytest

from resilient_slurm.monitor.stragglers import StragglerDetector, compute_s


def sections(forward, backward=0.0, optimizer=0.0, collective=0.0, data=0.0, step=None):
    total = forward + backward + optimizer + collective + data
    return {"data": data, "forward": forward, "backward": backward, "optimizer": optimizer,
            "collective": collective, "step": total if step is None else step}


def test_compute_is_the_marked_sections_else_the_step_less_its_waits():
    assert compute_s(sections(0.1, 0.2, 0.05, collective=3.0, data=1.0)) == pytest.approx(0.35)
    # a loop that marks nothing: its step less its data and its collective wait
    assert compute_s({"step": 2.0, "data": 0.5, "collective": 1.0}) == pytest.approx(0.5)
    assert compute_s({}) == 0.0


def test_a_rank_slow_for_the_steps_in_a_row_is_found_once_with_its_scores():
    d = StragglerDetector(factor=1.5, steps=3, min_s=0.05)
    fast, slow = sections(0.1, 0.2, collective=0.4), sections(0.3, 0.6, collective=0.0)
    found = []
    for step in range(1, 7):
        found += d.observe(step, {0: fast, 1: slow, 2: fast, 3: fast})
    (s,) = found  # once, at its third slow step, not again while it stays slow
    assert (s.rank, s.step, s.steps) == (1, 3, 3) and s.ratio == pytest.approx(3.0)
    assert s.compute_s == pytest.approx(0.9) and s.others_s == pytest.approx(0.3)
    assert s.sections["forward"] == pytest.approx(0.3) and s.sections["collective"] == 0.0
    assert s.scores[1] == pytest.approx(1 / 3, abs=1e-3) and s.scores[0] == pytest.approx(1.0)
    assert "rank 1" in s.describe() and "3.0x" in s.describe()


@pytest.mark.parametrize("rows, found", [
    # a slow step between fast ones is noise: the count starts again
    ([{0: 0.1, 1: 0.3}, {0: 0.1, 1: 0.1}, {0: 0.1, 1: 0.3}, {0: 0.1, 1: 0.3}], []),
    # slower by the factor but not by min_s: jitter on a tiny step
    ([{0: 0.01, 1: 0.03}] * 5, []),
    # below the factor
    ([{0: 1.0, 1: 1.4}] * 5, []),
    # found again after it recovered and slowed down again
    ([{0: 0.1, 1: 0.3}] * 3 + [{0: 0.1, 1: 0.1}] + [{0: 0.1, 1: 0.3}] * 3, [(1, 3), (1, 7)]),
    # one rank alone is compared with nobody
    ([{0: 5.0}] * 5, []),
])
def test_what_is_no_straggler_and_what_is_one_again(rows, found):
    d = StragglerDetector(factor=1.5, steps=3, min_s=0.05)
    got = []
    for step, row in enumerate(rows, 1):
        got += [(s.rank, s.step) for s in d.observe(step, {r: sections(c) for r, c in row.items()})]
    assert got == found


@pytest.mark.parametrize("override, line", [
    ("monitor.straggler.factor=1", "monitor.straggler.factor: 1 is not above 1 (a rank slower than the others by this "
                                   "factor is a straggler); set it above 1, e.g. 1.5"),
    ("monitor.straggler.factor=0.5", "monitor.straggler.factor: 0.5 is not above 1"),
    ("monitor.straggler.steps=1", "monitor.straggler.steps: 1 is not above 1 (one slow step is noise, not a "
                                  "straggler); set it to 2 or more, e.g. 20"),
    ("health.node_record_policy.window_h=0", "health.node_record_policy: window_h must be > 0"),
])
def test_bad_straggler_thresholds_are_one_line_and_exit_status_2(override, line, tmp_path, capsys):
    from resilient_slurm.exit_codes import ExitCode
    from resilient_slurm.launch.__main__ import main

    code = main(["+experiment=tiny_sft", override, f"run.root={tmp_path / 'root'}"])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG and len(err.splitlines()) == 1, err
    assert err.startswith("resilient_slurm: config error: " + line), err
    assert not (tmp_path / "root").exists()
