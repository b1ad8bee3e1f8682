"""A resume after a recorded config change (PBT's explore step) trains with the new values."""

import torch

from resilient_slurm.config import OptimConfig
from resilient_slurm.trainer.optim import apply_hyperparameters, build_optimizer, build_scheduler, lr_factor


def test_restored_hyperparameters_give_way_to_the_config():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    old = OptimConfig(lr=1e-3, warmup_steps=2)
    optimizer = build_optimizer(model, old)
    scheduler = build_scheduler(optimizer, old, 10)
    for _ in range(5):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    saved_opt, saved_sched = optimizer.state_dict(), scheduler.state_dict()
    new = OptimConfig(lr=3e-4, warmup_steps=2, weight_decay=0.01, beta2=0.99)
    optimizer = build_optimizer(model, new)
    scheduler = build_scheduler(optimizer, new, 10)
    optimizer.load_state_dict(saved_opt)
    scheduler.load_state_dict(saved_sched)
    assert optimizer.param_groups[0]["lr"] == 1e-3 * lr_factor(5, 2, 10, old.min_lr_ratio)  # the checkpoint's

    apply_hyperparameters(optimizer, scheduler, new)
    decay, no_decay = optimizer.param_groups
    assert decay["lr"] == no_decay["lr"] == 3e-4 * lr_factor(5, 2, 10, new.min_lr_ratio)
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["betas"]) == (0.01, 0.0, (0.9, 0.99))
    assert optimizer.state  # the moments stay
    optimizer.step()
    scheduler.step()
    assert decay["lr"] == 3e-4 * lr_factor(6, 2, 10, new.min_lr_ratio)
