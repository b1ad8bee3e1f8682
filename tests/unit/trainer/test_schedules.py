"""Warmup-stable-decay beside cosine: its shape, and that a run extends or anneals from a checkpoint."""

import math

import pytest
import torch

from resilient_slurm.config import OptimConfig
from resilient_slurm.trainer.optim import build_scheduler, schedule_factor, wsd_factor


@pytest.mark.parametrize("shape, middle", [("linear", 0.55), ("cosine", 0.55), ("sqrt", 1 - 0.9 * math.sqrt(0.5))])
def test_wsd_warms_up_holds_then_decays_to_the_floor(shape, middle):
    f = [wsd_factor(s, 10, 100, 0.1, 20, shape) for s in range(100)]
    assert f[:10] == [pytest.approx((s + 1) / 10) for s in range(10)]
    assert f[10:80] == [1.0] * 70
    assert f[89] == pytest.approx(middle) and f[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[80:], f[81:]))


def test_wsd_extends_from_a_stable_checkpoint_and_anneals_from_any_step():
    cfg = OptimConfig(schedule="wsd", warmup_steps=5, decay_fraction=0.2, min_lr_ratio=0.0)
    short, longer = schedule_factor(cfg, 100), schedule_factor(cfg, 400)
    assert [short(s) for s in range(80)] == [longer(s) for s in range(80)]  # the stable phase ignores the length
    anneal = schedule_factor(OptimConfig(schedule="wsd", warmup_steps=5, decay_steps=30, min_lr_ratio=0.0), 250 + 30)
    assert [anneal(s) for s in range(250)] == [longer(s) for s in range(250)] and anneal(279) == 0.0
    cosine_short, cosine_long = schedule_factor(OptimConfig(), 100), schedule_factor(OptimConfig(), 400)
    assert cosine_short(50) != cosine_long(50)  # why cosine cannot be extended


def test_the_scheduler_state_is_plain_numbers_and_rebuilds_from_config():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=1.0)
    cfg = OptimConfig(schedule="wsd", lr=1.0, warmup_steps=2, decay_steps=4, min_lr_ratio=0.0)
    sched = build_scheduler(opt, cfg, 10)
    for _ in range(7):
        opt.step()
        sched.step()
    state = sched.state_dict()
    again = build_scheduler(torch.optim.AdamW([p], lr=1.0), cfg, 10)
    again.load_state_dict(state)
    assert again.last_epoch == 7 and again.get_last_lr() == sched.get_last_lr() == [pytest.approx(0.5)]
