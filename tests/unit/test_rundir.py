from datetime import date

import pytest

from resilient_slurm import rundir
from resilient_slurm.config import Config, ConfigError
from resilient_slurm.naming import run_name, variant


def cfg(tmp_path, **optim):
    c = Config()
    c.run.root = str(tmp_path)
    c.run.experiment = "exp"
    for k, v in optim.items():
        setattr(c.optim, k, v)
    return c


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "base"),
        (["+experiment=tiny_sft"], "base"),
        (["optim.lr=1e-4"], "lr1e-4"),
        (["optim.lr=1e-4", "data.global_batch_size=32"], "lr1e-4-bs32"),
        (["data.seq_len=4096", "run.root=/x", "cluster.ranks=2", "checkpoint.every_steps=5"], "seq4096"),
        (["model=llama3_8b"], "base"),
        (["optim.beta2=0.99"], "beta20.99"),
        (["optim.lr=0.0001"], "lr1e-4"),
        (["optim.lr=3.0e-4"], "lr3e-4"),
        (["optim.lr=2.5e-05"], "lr2.5e-5"),
        (["optim.weight_decay=0.10"], "wd0.1"),
    ],
)
def test_variant_from_overrides(overrides, expected):
    assert variant(overrides) == expected


def test_run_name_shape():
    assert run_name(Config(), ["optim.lr=3e-4"], date(2026, 1, 2)) == "llama-tiny-synthetic-sft-20260102-lr3e-4"


def test_first_launch_creates_the_layout_and_relaunch_resumes(tmp_path):
    c = cfg(tmp_path)
    path, resumed = rundir.prepare(c, ["optim.lr=1e-4"], date(2026, 1, 2))
    assert not resumed and path == tmp_path / "exp" / "llama-tiny-synthetic-sft-20260102-lr1e-4"
    assert {p.name for p in path.iterdir()} >= {"config.yaml", "checkpoints", "logs", "run.json", "overrides.yaml"}
    again, resumed = rundir.prepare(cfg(tmp_path), ["optim.lr=1e-4"], date(2026, 1, 2))
    assert again == path and resumed
    assert rundir.load_config(path).run.name == path.name


def test_relaunch_with_a_different_learning_rate_is_refused_naming_the_key(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    rundir.prepare(first, [])
    changed = cfg(tmp_path, lr=3e-4)
    changed.run.name = "r"
    with pytest.raises(ConfigError, match=r"optim\.lr \(0\.0001 -> 0\.0003\)"):
        rundir.prepare(changed, [])


def test_relaunch_may_change_placement_keys(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    path, _ = rundir.prepare(first, [])
    moved = cfg(tmp_path)
    moved.run.name = "r"
    moved.cluster.ranks = 2
    moved.checkpoint.every_steps = 7
    _, resumed = rundir.prepare(moved, [])
    assert resumed and rundir.load_config(path).cluster.ranks == 2
    assert rundir.config_hash(first) == rundir.config_hash(moved)
