import pytest

from resilient_slurm.checkpoint.policy import SaveClock, step_reason, time_due
from resilient_slurm.config import CheckpointConfig


@pytest.mark.parametrize(
    "cfg, saves_at",
    [
        (CheckpointConfig(every_steps=100), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]),
        (CheckpointConfig(every_steps=0, exponential_first_step=100), [100, 200, 400, 800]),
        (CheckpointConfig(every_steps=0, exponential_first_step=3), [3, 6, 12, 24, 48, 96, 192, 384, 768]),
        (CheckpointConfig(every_steps=0), []),
        (CheckpointConfig(), [1000]),  # the default: milestones every 1000 steps
        # hybrid: both step policies at once
        (CheckpointConfig(every_steps=300, exponential_first_step=100), [100, 200, 300, 400, 600, 800, 900]),
    ],
)
def test_step_policies(cfg, saves_at):
    assert [s for s in range(1, 1001) if step_reason(s, cfg)] == saves_at


def test_step_reason_names_the_policy():
    cfg = CheckpointConfig(every_steps=300, exponential_first_step=100)
    assert step_reason(300, cfg) == "periodic"
    assert step_reason(400, cfg) == "exponential"
    assert step_reason(401, cfg) is None


@pytest.mark.parametrize(
    "minutes, last_s, now_s, due",
    [(30.0, 0.0, 1799.0, False), (30.0, 0.0, 1800.0, True), (0.5, 100.0, 131.0, True), (0.0, 0.0, 1e9, False)],
)
def test_time_policy(minutes, last_s, now_s, due):
    assert time_due(now_s, SaveClock(last_save_step=0, last_save_time_s=last_s), minutes * 60.0) is due
