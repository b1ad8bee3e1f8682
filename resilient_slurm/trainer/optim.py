"""AdamW with decoupled weight decay on matrices only, and the learning-rate schedules.

`optim.schedule=cosine`: linear warmup, then cosine decay to lr * min_lr_ratio over the rest of the run.
`optim.schedule=wsd` (warmup-stable-decay): linear warmup, the peak LR held, then a decay over the
last `decay_steps` (or `decay_fraction` of the steps) to lr * min_lr_ratio, shaped linear, cosine or
1 - sqrt. What a checkpoint keeps of the schedule is the step count and the peak LR (LambdaLR's
state); the factor is recomputed from the config at every start. So with wsd a run can be extended
from any checkpoint in its stable phase (raise train.max_steps: the LR so far is the same for any
length, the decay simply moves later) and annealed from any checkpoint (train.max_steps = its step
+ N, optim.decay_steps = N: the decay starts right there). A checkpoint taken mid-decay continues
its decay only with the same max_steps; under cosine every step's LR depends on the run's length,
so changing max_steps on resume moves the LR at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from resilient_slurm.config import OptimConfig


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak LR for the update that follows `step` completed updates (cosine)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def wsd_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float, decay_steps: int,
               shape: str) -> float:
    """Warmup-stable-decay: the multiplier of the peak LR for the update after `step` updates.
    The decay runs over the last `decay_steps` steps (at least one, and never into the warmup)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay = min(max(decay_steps, 1), max(total_steps - warmup_steps, 1))
    start = total_steps - decay
    if step < start:
        return 1.0
    progress = min((step - start + 1) / decay, 1.0)
    drop = {"linear": progress, "cosine": 0.5 * (1.0 - math.cos(math.pi * progress)),
            "sqrt": math.sqrt(progress)}[shape]
    return 1.0 - (1.0 - min_ratio) * drop


def schedule_factor(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """The configured schedule as a function of the completed step count."""
    if cfg.schedule == "wsd":
        decay = cfg.decay_steps or max(round(cfg.decay_fraction * total_steps), 1)
        return lambda step: wsd_factor(step, cfg.warmup_steps, total_steps, cfg.min_lr_ratio, decay, cfg.decay_shape)
    return lambda step: lr_factor(step, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """Over the parameters that train (a LoRA run's adapters; every one in a full fine-tune)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
        # One kernel per operation over all parameters: on the CPU the default is a Python loop over
        # them, which with FSDP2's DTensors costs more than the arithmetic on small models.
        foreach=True,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Its state_dict is plain numbers (the lambda is rebuilt from config), so it saves as JSON."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(cfg, total_steps))


def apply_hyperparameters(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                          cfg: OptimConfig) -> None:
    """Set what a checkpoint restored (the param groups' lr, betas, eps, weight decay; the schedule's
    peak LR) to the config's values, keeping the step count and the moments: a resume after a
    recorded config change (PBT's explore step). The config's peak LR replaces one a rollback lowered."""
    # The groups as build_optimizer makes them: matrices (decayed), then the rest.
    decays = [cfg.weight_decay, 0.0]
    for group, lr_lambda, decay in zip(optimizer.param_groups, scheduler.lr_lambdas, decays):
        group["betas"], group["eps"], group["weight_decay"] = (cfg.beta1, cfg.beta2), cfg.eps, decay
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * lr_lambda(scheduler.last_epoch)
    scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
