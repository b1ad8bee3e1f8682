"""A checksum of the bits of each parameter shard: what replicas compare after every update.

Each tensor's fingerprint is two 64-bit integers over its elements' bit patterns (a float32
element read as an int32, a bfloat16 one as an int16): their sum, and their sum weighted by
position (weights 1, 3, 5, ... restarting every CHUNK elements), both modulo 2^64. Integer sums
are exact and do not depend on the order of addition, so a GPU's parallel reduction and a CPU's
give the same value, and equal bits give equal fingerprints on any device. Any one flipped bit
changes the plain sum (by 2^b); the weighted sum also changes when two flips cancel in the plain
sum, or two elements trade places within a chunk.

Why not CRC32 (ISA-L, as the checkpoint's files use): it needs the bytes in host memory, a copy
off the GPU every step; the sums run where the shard lives, at the speed of one read of it
(bench/sdc.py measures both on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

CHUNK = 1 << 20
"""Elements summed at a time: bounds the int64 temporaries to 8 MiB whatever the shard's size."""

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_weights: dict[torch.device, torch.Tensor] = {}


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter or optimizer state: a DTensor's local shard, else itself.
    The same storage, so writing into it writes the parameter."""
    return t._local_tensor if isinstance(t, DTensor) else t.detach()


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width, flat (a view, no copy when contiguous)."""
    flat = t.reshape(-1)
    if not flat.is_floating_point() and not flat.is_complex():
        return flat
    return flat.view(_INT_OF_WIDTH[flat.element_size()])


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """The tensor's two sums, an int64 tensor of shape (2,) on its device."""
    v = bits(local(t))
    out = torch.zeros(2, dtype=torch.int64, device=v.device)
    for start in range(0, v.numel(), CHUNK):
        part = v[start:start + CHUNK].to(torch.int64)
        out[0] += part.sum()
        out[1] += (part * _position_weights(v.device)[:part.numel()]).sum()
    return out


def fingerprints(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One row per tensor: an int64 tensor of shape (len(tensors), 2) on their device."""
    if not tensors:
        return torch.zeros((0, 2), dtype=torch.int64)
    return torch.stack([fingerprint(t) for t in tensors])


def _position_weights(device: torch.device) -> torch.Tensor:
    w = _weights.get(device)
    if w is None:
        w = _weights[device] = torch.arange(1, 2 * CHUNK, 2, dtype=torch.int64, device=device)
    return w
