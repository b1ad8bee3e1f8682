"""compare: the keys that differ, a warning when an ablation changes more than one, metric deltas."""

import json

from resilient_slurm.analysis.compare import compare, main
from resilient_slurm.config import Config
from resilient_slurm.launch.prepare import prepare


def run(tmp_path, name, rows=(), **changes):
    c = Config()
    c.run.root, c.run.experiment, c.run.name = str(tmp_path), "exp", name
    for key, value in changes.items():
        section, field = key.split("__")
        setattr(getattr(c, section), field, value)
    path, _ = prepare(c, [])
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows(n, offset=0.0, every=0):
    out = []
    for step in range(1, n + 1):
        row = {"step": step, "loss": 5.0 - step / 100 + offset}
        if every and step % every == 0:
            row["val_loss"] = 5.5 - step / 100 + offset
        out.append(row)
    return out


def test_one_changed_key_is_named_exactly_and_no_warning(tmp_path, capsys):
    a = run(tmp_path, "a", rows(100, every=50))
    b = run(tmp_path, "b", rows(80, offset=-0.1, every=50), optim__lr=3e-4, cluster__ranks=2, checkpoint__every_steps=7)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "1 config key differs:\n  optim.lr " in out and "0.0001 -> 0.0003" in out and "warning" not in out
    assert "cluster.ranks" in out.split("placement and logging")[1]  # listed apart, not as a variable
    loss = out.split("\nloss at matching steps:")[1].split("\nval_loss")[0]
    assert [int(line.split()[0]) for line in loss.strip().splitlines()[1:]] == [1, 17, 33, 48, 64, 80]
    assert "-0.1000" in loss
    val = out.split("val_loss at matching steps:")[1]
    assert [line.split()[0] for line in val.strip().splitlines()[1:]] == ["50"]


def test_three_changed_keys_warn(tmp_path, capsys):
    a = run(tmp_path, "a", rows(10))
    b = run(tmp_path, "b", rows(10), optim__lr=3e-4, optim__weight_decay=0.0, train__seed=7)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "3 config keys differ" in out
    warning = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warning == [("warning: an ablation should change one variable, these runs differ in 3: optim.lr, "
                        "optim.weight_decay, train.seed; the deltas cannot be pinned on one of them")]


def test_pure_comparison_of_flat_configs():
    c = compare({"optim.lr": 1, "run.name": "a", "eval.every_steps": 5}, {"optim.lr": 2, "run.name": "b", "x.new": 1},
                [{"step": 1, "loss": 2.0}], [{"step": 2, "loss": 1.0}])
    assert c.variables == [("optim.lr", 1, 2), ("x.new", None, 1)]
    assert c.placement == [("eval.every_steps", 5, None)] and c.deltas == {} and c.warning


def test_not_a_run(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
