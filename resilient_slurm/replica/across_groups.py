"""The sentinel's collectives across replica groups (cluster.replica_ft): the copies of a shard live
in process groups of their own, which meet only through the replica engine's sum (torchft's
managed all-reduce over the same rank of every live group).

A gather as a sum: each group writes its integers into its own slot of a zero buffer, one slot per
configured group, and the sum over the live groups is every live group's value exactly (x + 0 =
x, integers, any order). A slot's first element says whether its group took part: a group that is
not in the quorum, or that torchft did not let take part (it zeroes what it sends), is absent. A
copy from one group is the same sum with only that group's slot. Floats travel as their bits, so
a healed shard is the source's bit for bit (a float sum would turn -0.0 into 0.0).

Every rank of every live group makes the same calls in the same order: what they compare is
decided by values that are equal everywhere (the gathered fingerprints), never by a rank's own
view. A failure during a call leaves `replicas.errored()`, and the caller gives the check up for
this step (the next quorum goes on without the failed group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from resilient_slurm.replica.engine import Replicas
from resilient_slurm.replica.fingerprint import bits, fingerprints
from resilient_slurm.replica.shard_heal import held_tensors
from resilient_slurm.replica.verdict import Fingerprint
from resilient_slurm.session.distributed import Comm
from resilient_slurm.session.replica_place import ReplicaPlace

NODE_BYTES = 255
"""Longest node name sent across groups (a host name's limit)."""


def by_group(replicas: Replicas, place: ReplicaPlace, values: torch.Tensor) -> dict[int, torch.Tensor] | None:
    """Every live group's `values` (integers; the same shape in every group), by group, as int64 on
    `values`' device; None when a group failed during the sum."""
    flat = values.reshape(-1).to(torch.int64)
    slots = torch.zeros((place.groups, flat.numel() + 1), dtype=torch.int64, device=flat.device)
    slots[place.group, 0] = 1
    slots[place.group, 1:] = flat
    replicas.sum_(slots)
    if replicas.errored():
        return None
    return {g: slots[g, 1:].view(values.shape) for g in range(place.groups) if int(slots[g, 0]) == 1}


def as_rows(t: torch.Tensor) -> list[Fingerprint]:
    """An (n, 2) tensor of fingerprints as the rulings compare them."""
    return [(int(a), int(b)) for a, b in t.tolist()]


def fingerprints_by_group(replicas: Replicas, place: ReplicaPlace, params: Sequence[torch.Tensor],
                          device: torch.device) -> dict[int, list[Fingerprint]] | None:
    """Every live group's fingerprints of this rank's shard, by group; None when a group failed."""
    got = by_group(replicas, place, fingerprints(params).to(device))
    return None if got is None else {g: as_rows(v) for g, v in got.items()}


@torch.no_grad()
def copy_group(replicas: Replicas, place: ReplicaPlace, params: Sequence[torch.Tensor],
               optimizer: torch.optim.Optimizer, source: int, into: set[int], device: torch.device) -> int | None:
    """Every parameter shard and its optimizer state of group `source` into the groups `into`,
    bit for bit (every live group calls it; the others keep theirs). The bytes this rank took in
    (or sent); None when a group failed during a copy."""
    moved = 0
    for t in held_tensors(params, optimizer):
        word = bits(t)
        # AdamW's `step` stays on the host; NCCL sums only what is on the device.
        sent = (word if place.group == source else torch.zeros_like(word)).to(device, torch.int64, copy=True)
        replicas.sum_(sent)
        if replicas.errored():
            return None
        if place.group in into:
            word.copy_(sent.to(word.device, word.dtype))
        moved += t.numel() * t.element_size()
    return moved


def nodes_by_rank(replicas: Replicas, place: ReplicaPlace, comm: Comm) -> list[str] | None:
    """Every rank's node across the groups, by global rank ('' for a group that is not live); None
    when a group failed during the gather."""
    name = comm.node.encode()[:NODE_BYTES]
    row = torch.zeros(NODE_BYTES, dtype=torch.int64, device=comm.device)
    row[:len(name)] = torch.tensor(list(name), dtype=torch.int64)
    got = by_group(replicas, place, row)
    if got is None:
        return None
    mine = {place.group_size * g + comm.rank: bytes(v for v in r.tolist() if v).decode() for g, r in got.items()}
    nodes = [""] * (place.groups * place.group_size)
    for part in comm.all_gather_object(mine):
        for rank, node in part.items():
            nodes[rank] = node
    return nodes
