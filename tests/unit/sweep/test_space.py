"""The search space in Hydra's grammar: what parses, and the one-line error for what does not."""

import random

import pytest

from resilient_slurm.sweep.space import Dimension, SpaceError, grid_points, is_search_argument, override, parse_space

CONFIG = {"optim.lr": 1e-4, "optim.warmup_steps": 20, "model.dtype": "float32", "data.mix": {},
          "run.name": None, "train.pause_at_step": 0}


def test_the_issue_s_example_parses():
    lr, warmup = parse_space(["optim.lr=tag(log,interval(1e-5,1e-3))", "optim.warmup_steps=choice(10,50,100)"],
                             CONFIG)
    assert lr == Dimension("optim.lr", low=1e-5, high=1e-3, log=True)
    assert warmup == Dimension("optim.warmup_steps", choices=(10, 50, 100))


@pytest.mark.parametrize("arg, dim", [
    ("optim.warmup_steps=range(8,33,step=8)", Dimension("optim.warmup_steps", choices=(8, 16, 24, 32))),
    ("optim.warmup_steps=interval(1,9)", Dimension("optim.warmup_steps", low=1, high=9, integer=True)),
    ("optim.warmup_steps=int(interval(1,9))", Dimension("optim.warmup_steps", low=1, high=9, integer=True)),
    ("model.dtype=float32,bfloat16", Dimension("model.dtype", choices=("float32", "bfloat16"))),
    ("optim.lr=range(0.1,0.4,0.1)", Dimension("optim.lr", choices=(0.1, 0.2, 0.30000000000000004))),
])
def test_spaces(arg, dim):
    assert parse_space([arg], CONFIG) == [dim]


@pytest.mark.parametrize("arg, message", [
    ("optim.lrr=interval(1e-5,1e-3)", "optim.lrr is not a config key; did you mean optim.lr?"),
    ("optim.lr=log(1e-5,1e-3)", "write tag(log,interval(A,B))"),
    ("optim.lr=interval(1e-5", "no viable alternative"),
    ("optim.lr=interval(1e-3,1e-5)", "is empty or reversed; write interval(low,high) with low < high"),
    ("optim.lr=tag(log,interval(0,1e-3))", "a log interval needs positive bounds"),
    ("optim.warmup_steps=range(5,1)", "is empty; make start < stop"),
    ("optim.warmup_steps=interval(1.5,3)", "is an integer; give whole bounds"),
    ("model.dtype=interval(0,1)", "is not numeric"),
    ("run.name=choice(a,b)", "cannot be searched"),
    ("train.pause_at_step=choice(1,2)", "cannot be searched"),
    ("optim.lr=tag(lg,interval(1e-5,1e-3))", "unknown tag(s) lg"),
    ("optim.lr=choice(1e-4,1e-4)", "listed twice"),
    ("data.mix=choice([1],[2])", "a single value each"),
])
def test_a_bad_space_is_one_line_naming_the_argument_and_the_fix(arg, message):
    with pytest.raises(SpaceError) as e:
        parse_space([arg], CONFIG)
    (line,) = str(e.value).splitlines()
    assert line.startswith(f"{arg}: ") and message in line


def test_every_problem_is_reported_at_once():
    with pytest.raises(SpaceError) as e:
        parse_space(["optim.lrr=interval(1,2)", "optim.warmup_steps=range(5,1)"], CONFIG)
    assert len(str(e.value).splitlines()) == 2


def test_no_space_at_all_is_refused():
    with pytest.raises(SpaceError, match="no search space"):
        parse_space([], CONFIG)


@pytest.mark.parametrize("arg, is_space", [
    ("optim.lr=1e-4", False), ("sweep=optuna", False), ("+experiment=tiny_sft", False), ("~x", False),
    ("optim.lr=1e-4,3e-4", True), ("optim.lr=interval(1,", True), ("optim.lr=tag(log,interval(1,2))", True),
])
def test_search_arguments_are_told_from_plain_overrides(arg, is_space):
    assert is_search_argument(arg) is is_space


def test_grid_points_in_order_and_no_intervals():
    dims = parse_space(["optim.warmup_steps=range(1,3)", "model.dtype=float32,bfloat16"], CONFIG)
    assert grid_points(dims) == [
        {"optim.warmup_steps": 1, "model.dtype": "float32"}, {"optim.warmup_steps": 1, "model.dtype": "bfloat16"},
        {"optim.warmup_steps": 2, "model.dtype": "float32"}, {"optim.warmup_steps": 2, "model.dtype": "bfloat16"},
    ]
    with pytest.raises(SpaceError, match="optim.lr: an interval has no grid points"):
        grid_points(parse_space(["optim.lr=interval(1e-5,1e-3)"], CONFIG))


def test_samples_stay_in_the_prior():
    rng = random.Random(0)
    lr = Dimension("optim.lr", low=1e-5, high=1e-3, log=True)
    steps = Dimension("optim.warmup_steps", low=1, high=9, integer=True)
    assert all(1e-5 <= lr.sample(rng) <= 1e-3 for _ in range(200))
    assert {steps.sample(rng) for _ in range(200)} == set(range(1, 10))


def test_overrides_spell_values_hydra_reads_back():
    assert [override("a", v) for v in (1e-4, 3, True, "x-y", "a b")] == ["a=0.0001", "a=3", "a=true", "a=x-y",
                                                                        "a='a b'"]
