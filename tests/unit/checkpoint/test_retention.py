import pytest

from resilient_slurm.checkpoint.retention import CheckpointInfo, plan_retention
from resilient_slurm.config import CheckpointConfig


def infos(*steps, optim=True):
    return [CheckpointInfo(s, optim) for s in steps]


@pytest.mark.parametrize(
    "cfg, existing, delete, strip",
    [
        # keep the newest K
        (CheckpointConfig(keep_last=3, optimizer_on_last=0), infos(10, 20, 30, 40, 50), (20, 10), ()),
        # never fewer than two, whatever the config says
        (CheckpointConfig(keep_last=1, optimizer_on_last=0), infos(10, 20, 30), (10,), ()),
        # nothing to do
        (CheckpointConfig(keep_last=3, optimizer_on_last=0), infos(10, 20), (), ()),
        # optimizer state only on the newest M
        (CheckpointConfig(keep_last=5, optimizer_on_last=2), infos(10, 20, 30, 40), (), (20, 10)),
        # already stripped checkpoints are not stripped again
        (CheckpointConfig(keep_last=5, optimizer_on_last=1), [*infos(10, optim=False), *infos(20, 30)], (), (20,)),
        # milestones survive retention
        (CheckpointConfig(keep_last=2, keep_every_steps=100, optimizer_on_last=0), infos(50, 100, 150, 200, 250),
         (150, 50), ()),
        # order of the input does not matter
        (CheckpointConfig(keep_last=2, optimizer_on_last=1), infos(30, 10, 20), (10,), (20,)),
    ],
)
def test_plan_retention(cfg, existing, delete, strip):
    plan = plan_retention(existing, cfg)
    assert plan.delete == delete
    assert plan.strip_optimizer == strip


def test_newest_is_never_deleted_or_stripped():
    for k in range(0, 6):
        for m in range(0, 4):
            plan = plan_retention(infos(*range(1, 12)), CheckpointConfig(keep_last=k, optimizer_on_last=m))
            assert 11 not in plan.delete and 11 not in plan.strip_optimizer
            assert 10 not in plan.delete


def test_pinned_checkpoints_are_neither_deleted_nor_stripped_this_time():
    cfg = CheckpointConfig(keep_last=2, optimizer_on_last=1)
    plan = plan_retention(infos(10, 20, 30, 40), cfg, pinned=frozenset({10, 30}))
    assert plan.delete == (20,)
    assert plan.strip_optimizer == ()
