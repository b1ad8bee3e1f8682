"""Tensors and a little JSON sent between ranks: what a re-run of an update needs, and its answer.

A `Parcel` travels as three point-to-point messages on the default process group: its two sizes,
its JSON header (what it is, and each tensor's dtype and shape), and every tensor's bytes in one
buffer. Each call posts all of a rank's sends and receives of a round at once, so a ring of ranks
that all send and all receive cannot deadlock; a call carries at most one parcel each way between
two ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Parcel:
    meta: Any
    tensors: list[torch.Tensor] = field(default_factory=list)


def exchange(sends: Sequence[tuple[int, Parcel]], receives: Sequence[int], device: torch.device) -> dict[int, Parcel]:
    """Send each parcel to its rank and receive one from each rank of `receives` (one per sender);
    every rank of the round calls it, with the same pairs seen from its side."""
    packed = [(dst, *_pack(p, device)) for dst, p in sends]
    sizes_out = [torch.tensor([len(h), d.numel()], dtype=torch.int64, device=device) for _, h, d in packed]
    sizes_in = {src: torch.zeros(2, dtype=torch.int64, device=device) for src in receives}
    _round([(dst, t) for (dst, _, _), t in zip(packed, sizes_out)], list(sizes_in.items()), tag=0)
    heads = {src: torch.empty(int(s[0]), dtype=torch.uint8, device=device) for src, s in sizes_in.items()}
    datas = {src: torch.empty(int(s[1]), dtype=torch.uint8, device=device) for src, s in sizes_in.items()}
    _round([(dst, torch.frombuffer(bytearray(h), dtype=torch.uint8).to(device)) for dst, h, _ in packed],
           list(heads.items()), tag=1)
    _round([(dst, d) for dst, _, d in packed], list(datas.items()), tag=2)
    return {src: _unpack(bytes(heads[src].cpu().numpy()), datas[src]) for src in receives}


def _round(sends: list[tuple[int, torch.Tensor]], receives: list[tuple[int, torch.Tensor]], tag: int) -> None:
    """One message to and from each peer (a parcel per pair and call: the tag names the part)."""
    ops = [dist.P2POp(dist.isend, t, peer, tag=tag) for peer, t in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, peer, tag=tag) for peer, t in receives if t.numel()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _pack(p: Parcel, device: torch.device) -> tuple[bytes, torch.Tensor]:
    shapes = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in p.tensors]
    header = json.dumps({"meta": p.meta, "tensors": shapes}).encode()
    flat = [t.detach().to(device).contiguous().reshape(-1).view(torch.uint8) for t in p.tensors]
    data = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)
    return header, data


def _unpack(header: bytes, data: torch.Tensor) -> Parcel:
    head = json.loads(header)
    tensors, at = [], 0
    for dtype_name, shape in head["tensors"]:
        dtype = getattr(torch, dtype_name)
        n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        # a copy: a view of the shared buffer would need its offset aligned to the dtype
        tensors.append(data[at:at + n].clone().view(dtype).reshape(shape))
        at += n
    return Parcel(head["meta"], tensors)
