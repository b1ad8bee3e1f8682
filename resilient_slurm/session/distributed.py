"""torch.distributed for the training loop: process-group setup, the device, and the few collectives
the loop needs besides FSDP2's own.

Every run has a process group, one rank included (an in-process store, no port): FSDP2 shards over
a device mesh even of size one, so the loop and the checkpoints take one code path at any world
size. The device follows the backend: NCCL means this rank's GPU, also for a single rank.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from resilient_slurm.session.replica_place import ReplicaPlace
from resilient_slurm.process.launch import RankLaunch


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    node: str = ""
    """The node the rank runs on (a Slurm node name); empty: this machine's host name. A node-local
    checkpoint tier keeps its files per node."""
    local_world_size: int = 0
    """Ranks on this node, which share its CPU threads; 0: the world size."""
    replica: ReplicaPlace | None = None
    """With cluster.replica_ft: the rank's replica group, whose ranks alone make this process group
    (`rank` and `world_size` are then the group's)."""

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> RankInfo:
        """From what the launcher told the rank (`RankLaunch`: torchrun-style variables)."""
        launch = RankLaunch.from_env(os.environ if env is None else env)
        return RankInfo(launch.rank, launch.world_size, launch.local_rank, launch.master_addr, launch.master_port,
                        local_world_size=launch.local_world_size)


def pick_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


class Comm:
    """The collectives the loop and the checkpointer use, on one process group."""

    def __init__(self, info: RankInfo, backend: str = "gloo", timeout_s: float = 300.0) -> None:
        began = time.perf_counter()
        self.rank = info.rank
        self.world_size = info.world_size
        self.local_rank = info.local_rank
        self.node = info.node or socket.gethostname()
        self.backend = pick_backend(backend)
        self.device = torch.device("cpu")
        if self.backend == "nccl":
            self.device = torch.device("cuda", info.local_rank)
            torch.cuda.set_device(self.device)
        self.replica = info.replica
        self.store_addr, self.store_port = info.master_addr, info.master_port
        store: dist.Store
        if self.world_size == 1 and self.replica is None:
            store = dist.HashStore()
        else:
            # A store of our own per process group: a fresh rendezvous each time the job starts, so
            # stale keys from an earlier attempt can never be picked up (seen with gloo restarts). A
            # replica group of one rank needs it too: the other groups meet on it (torchft).
            store = dist.TCPStore(
                info.master_addr, info.master_port, info.world_size, is_master=info.rank == 0,
                timeout=timedelta(seconds=timeout_s),
            )
        dist.init_process_group(
            self.backend, store=store, rank=info.rank, world_size=info.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        self._mesh: DeviceMesh | None = None
        self.host_group = dist.new_group(backend="gloo") if self.distributed and self.backend != "gloo" else None
        """Host-side collectives beside NCCL (None: the default group is gloo already)."""
        self._owned = True
        self.setup_s = time.perf_counter() - began
        """The rendezvous: joining the process group and its mesh (a restart's breakdown has it)."""

    @classmethod
    def adopt(cls) -> Comm:
        """The collectives over a default process group the caller already made (a user's own loop
        called `init_process_group`): nothing is initialised twice, and `close` leaves it open."""
        self = cls.__new__(cls)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.backend = str(dist.get_backend())
        self.device = torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self._mesh = None
        self.host_group = dist.new_group(backend="gloo") if self.distributed and self.backend != "gloo" else None
        self.replica = None
        self.store_addr, self.store_port = "", 0  # not known of a group another made; replica groups need ours
        self._owned = False
        self.setup_s = 0.0
        return self

    @property
    def mesh(self) -> DeviceMesh:
        """A 1-D mesh over every rank, on this rank's device type, made on first use (every rank
        must ask at the same point: making it is collective). The built-in trainer shards over its
        layout's mesh instead (parallel/mesh.py)."""
        if self._mesh is None:
            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self._mesh

    @property
    def global_rank(self) -> int:
        """The rank among every rank of the run: `rank` itself, unless this process group is one
        replica group's (cluster.replica_ft). Logs, heartbeats and the ledger name ranks by it."""
        return self.rank if self.replica is None else self.replica.global_rank(self.rank)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum in place over ranks (the tensor must live on `self.device`)."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_floats(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (a flag any rank raised is > 0; one-hot slots all-gather)."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def count(self, flag: bool) -> int:
        """How many ranks pass True. Over the host group, so it never waits for the device to drain:
        it is called between the kernel launches of every FSDP2 unit (runtime/oom.py)."""
        if not self.distributed:
            return int(flag)
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.host_group)
        return int(t.item())

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Destroy the process group, unless it was adopted: its maker closes it."""
        if self._owned and dist.is_initialized():
            dist.destroy_process_group()
            _forget_dtensor_shardings()


def _forget_dtensor_shardings() -> None:
    """DTensor caches each op's output placements for the life of the process. A vocab-parallel
    embedding's placement holds its forward's mask until the all-reduce that ends it; a peer lost in
    that all-reduce leaves the mask behind, and a rank that restarts in its process would meet it
    in its next forward ("MaskBuffer has been materialized with conflicting data")."""
    # Imported here: the module pulls in inductor, seconds of start-up a rank otherwise never spends.
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
