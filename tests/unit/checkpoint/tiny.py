"""A real model, optimizer and scheduler one step into training, small enough for unit tests."""

import torch

from resilient_slurm.config import ModelConfig, OptimConfig
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.model.decoder import plain_model

TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                   max_seq_len=16)


def trained(seed: int):
    """(model, optimizer, scheduler) after one step; the same seed gives the same state."""
    torch.manual_seed(seed)
    model = plain_model(TINY, seed)
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), 10)
    model(torch.randint(0, 64, (2, 8))).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched
