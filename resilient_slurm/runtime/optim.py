"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from resilient_slurm.config import OptimConfig


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak LR for the update that follows `step` completed updates."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


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
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )


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
