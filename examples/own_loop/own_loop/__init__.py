"""A plain PyTorch FSDP2 training loop with its own model and data, and the same loop under resilient_slurm.

    parts    the model (a tiny causal transformer) and the data (a seeded token stream with a position)
    plain    the loop as its author wrote it: torchrun, FSDP2, nothing from resilient_slurm
    train    the same loop with a resilient_slurm Session: emergency saves, exact resume, requeue
"""
