"""`python -m resilient_slurm.sweep`: every problem with the command, one line each, before anything
is created or submitted."""

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.sweep.__main__ import main

BASE = ["+experiment=tiny_sft", "eval.every_steps=10", "train.max_steps=40", "sweep=random", "sweep.trials=2"]


def run(tmp_path, capsys, *args):
    code = main([*BASE, f"run.root={tmp_path}", *args])
    return code, capsys.readouterr().err.splitlines()


def test_an_unknown_key_and_a_malformed_range_are_refused_before_anything_is_created(tmp_path, capsys):
    code, lines = run(tmp_path, capsys, "optim.lrr=tag(log,interval(1e-5,1e-3))", "optim.lr=interval(1e-3,1e-5)",
                      "optim.warmup_steps=range(10,5)")
    assert code == ExitCode.CONFIG and len(lines) == 3
    assert "optim.lrr is not a config key; did you mean optim.lr?" in lines[0]
    assert "interval(0.001,1e-05) is empty or reversed" in lines[1]
    assert "range(10,5,step=1) is empty" in lines[2]
    assert all(line.startswith("resilient_slurm: sweep: error: ") for line in lines)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["optim.warmup_steps=choice(10,400)"], "optim.warmup_steps=choice(10,400): with 400: optim.warmup_steps: 400 "
                                            "must be below train.max_steps=40"),
    (["sweep=grid", "optim.lr=interval(1e-5,1e-3)"], "optim.lr: an interval has no grid points"),
    (["sweep.trials=0", "optim.lr=interval(1e-5,1e-3)"], "sweep.trials: 0; set the number of trials"),
    (["eval.every_steps=0", "optim.lr=interval(1e-5,1e-3)"], "sweep.metric: val_loss is written on evaluation steps"),
    (["sweep=asha", "sweep.min_steps=5", "optim.lr=interval(1e-5,1e-3)"], "eval.every_steps: 10 does not divide the "
                                                                          "ASHA rungs [5, 15]"),
    (["sweep=pbt", "sweep.trials=1", "optim.lr=interval(1e-5,1e-3)"], "a PBT population needs 2 members"),
    (["sweep=optuna", "sweep.scheduler=asha", "optim.lr=interval(1e-5,1e-3)"], "sweep.pruner: median cannot be "
                                                                              "combined with sweep.scheduler=asha"),
    (["sweep=nope", "optim.lr=interval(1e-5,1e-3)"], "sweep: no option 'nope'; choose one of asha, grid, optuna"),
    (["sweep.controller=slurm", "optim.lr=interval(1e-5,1e-3)"], "its trials must be Slurm jobs too; add cluster=slurm"),
])
def test_a_search_that_cannot_run_is_refused_with_the_fix(tmp_path, capsys, args, message):
    code, lines = run(tmp_path, capsys, *args)
    assert code == ExitCode.CONFIG and len(lines) == 1 and message in lines[0], lines
    assert not list(tmp_path.iterdir())


def test_a_different_search_under_an_existing_name_is_refused(tmp_path, capsys):
    from resilient_slurm.sweep import cli, study

    plan = cli.parse([*BASE, f"run.root={tmp_path}", "sweep.name=s", "optim.lr=interval(1e-5,1e-3)"])
    study.check_spec(plan.path(), plan.search())
    other = cli.parse([*BASE, f"run.root={tmp_path}", "sweep.name=s", "optim.lr=interval(1e-5,1e-2)",
                       "sweep.parallel=4"])
    with pytest.raises(study.StudyError, match="started with a different space; run its original command"):
        study.check_spec(other.path(), other.search())
    same = cli.parse([*BASE, f"run.root={tmp_path}", "sweep.name=s", "optim.lr=interval(1e-5,1e-3)",
                      "sweep.parallel=4", "sweep.trials=9"])
    assert study.check_spec(same.path(), same.search())  # how wide or long it runs may change


def test_config_and_space_problems_are_reported_together(tmp_path, capsys):
    code, lines = run(tmp_path, capsys, "optim.grad_clip=-1", "optim.lrr=interval(1e-5,1e-3)")
    assert code == ExitCode.CONFIG and len(lines) == 2
    assert "optim.grad_clip: -1.0; set it >= 0" in lines[0] and "optim.lrr is not a config key" in lines[1]


def test_the_default_name_is_the_same_for_the_same_command(tmp_path):
    from resilient_slurm.sweep import cli

    args = [*BASE, f"run.root={tmp_path}", "optim.lr=interval(1e-5,1e-3)"]
    a, b = cli.parse(args), cli.parse([*args[::-1]])
    c = cli.parse([*args, "optim.warmup_steps=choice(5,10)"])
    assert a.name() == b.name() != c.name() and a.name().startswith("random-")
