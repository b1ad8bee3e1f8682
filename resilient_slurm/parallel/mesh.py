"""The run's device mesh, built from its `Layout`, and the views each part of the run uses.

Only the axes a layout uses become mesh dimensions (`dp_shard` always, as FSDP2 shards over it even
at size one), so a plain FSDP2 run keeps the 1-D mesh and the process groups it always had, and a
mesh of 10,000 ranks creates no groups for axes of size one. Axis order, outermost first, is
`MESH_DIMS`: consecutive ranks share a tensor-parallel group (one node).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from resilient_slurm.config import MESH_DIMS, Coords, Layout


@dataclass(frozen=True)
class MeshPosition:
    """This rank's place in the layout, as the data and the loss need it."""

    layout: Layout
    rank: int

    @property
    def coords(self) -> Coords:
        return self.layout.coords(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def counts_data(self) -> bool:
        """This rank speaks for its data-parallel group when the group's tokens and loss are summed
        over the world: the first TP rank of the last pipeline stage (the one that has the loss)."""
        c = self.coords
        return c.tp == 0 and c.pp == self.layout.pp - 1


class ParallelMesh:
    """The N-D mesh over every rank, on this rank's device type."""

    def __init__(self, layout: Layout, device_type: str, rank: int) -> None:
        self.layout = layout
        self.position = MeshPosition(layout, rank)
        sizes = dict(zip(MESH_DIMS, layout.shape))
        self.dims = tuple(d for d in MESH_DIMS if sizes[d] > 1 or d == "dp_shard")
        self.mesh: DeviceMesh = init_device_mesh(device_type, tuple(sizes[d] for d in self.dims),
                                                 mesh_dim_names=self.dims)

    @cached_property
    def dp(self) -> DeviceMesh:
        """What FSDP2 shards over: (dp_replicate, dp_shard) for HSDP, else dp_shard."""
        if "dp_replicate" in self.dims:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]

    @cached_property
    def tp(self) -> DeviceMesh | None:
        return self.mesh["tp"] if "tp" in self.dims else None

    @cached_property
    def pp_group(self) -> dist.ProcessGroup | None:
        return self.mesh["pp"].get_group() if "pp" in self.dims else None
