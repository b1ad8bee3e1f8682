"""A sharded model's and optimizer's values gathered whole into one file (the reference), and the
check that a rank holds exactly its rows of them after a load."""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.tensor import DTensor

from resilient_slurm.checkpoint.state import local_rows

FILE = "reference.safetensors"


def write_reference(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, directory: str) -> None:
    """Every rank takes part in the gathers; rank 0 writes the file."""
    full = {f"model/{n}": p.full_tensor() for n, p in model.named_parameters()}
    for name, p in model.named_parameters():
        for key, value in optimizer.state[p].items():
            full[f"optim/{name}.{key}"] = value.full_tensor() if isinstance(value, DTensor) else value
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(directory, FILE))


def assert_holds_reference_rows(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str) -> None:
    ref = load_file(os.path.join(directory, FILE))
    for name, p in model.named_parameters():
        start, stop = local_rows(p)
        assert torch.equal(p.to_local(), ref[f"model/{name}"][start:stop]), name
        for key, value in optimizer.state[p].items():
            expected = ref[f"optim/{name}.{key}"]
            got = value.to_local() if isinstance(value, DTensor) else value
            assert torch.equal(got, expected[start:stop] if expected.ndim else expected), f"{name}.{key}"
