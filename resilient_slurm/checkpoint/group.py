"""The checkpoint's own process group, for the collectives of saves that run in the background.

A background save agrees with the other ranks (barrier, all-gather of file CRCs, commit outcome)
while the training loop runs its own collectives. Every rank must issue one group's collectives
in the same order, and gloo must not be driven by two threads at once on one group, so saves get a
group of their own, created once by every rank at start-up in the same order (`new_group` is itself
collective). It is gloo even when training uses NCCL: these collectives move small Python objects
between host threads and must not queue behind the GPU streams.

Chosen over coordinating the commit from the training thread at later step boundaries (which would
add a collective to every step and delay commits by up to a step) and over a file handshake
through the checkpoint directory (which needs polling, and a timeout for a rank that died).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from resilient_slurm.checkpoint.collectives import Collectives, RunCollectives


class GroupComm:
    def __init__(self, rank: int, world_size: int, group: Any) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out


def checkpoint_group(comm: RunCollectives, timeout_s: float) -> Collectives:
    """Collectives for saves; one rank needs none, so it gets `comm` and its trivial ones."""
    if not comm.distributed:
        return comm
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return GroupComm(comm.rank, comm.world_size, group)
