"""`Replicas` on torchft: its Manager per rank, its lighthouse's quorum, its reconfigurable process
group for the cross-group sum, and its HTTP checkpoint transport for healing.

Why torchft: it is the maintained engine made for exactly this (a quorum per step, a process group
rebuilt over whoever is live, a lagging group healed from a live one's memory), and it runs under
torch 2.13 on gloo here, NCCL by design. What we keep of our own: the deal of a missing group's
micro-batches (plan.py: torchft's groups each train their own batch, so a loss changes the batch),
the sum (torchft averages by default; our loss is already divided by the global target count),
the heal payload (heal.py), and who writes the run's records.

How it is driven: `use_async_quorum=False`, so the quorum, and a heal, finish before the step's
first forward (the healed group trains the very step it joins, with the deal the quorum implies);
`init_sync=False`, since every group builds the same initial weights from the seed. The process
group's timeout is `cluster.replica_timeout_s` (a late group is dropped from a reduction after it);
the Manager's, which also bounds a heal's transfer, is `cluster.collective_timeout_s`.

What torchft does not give, and this adds: the quorum's members and heal source are read from the
quorum result its client returns (a thin wrapper records it: the Manager keeps only counts).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch

from resilient_slurm.replica.engine import Heal, Quorum, QuorumFailed, StateFns
from resilient_slurm.session.replica_place import ReplicaPlace

GROUP_PREFIX = "replica_group_"
"""torchft's replica id is `<prefix><group>`: its own global-rank arithmetic reads the trailing digits."""
CONNECT_TIMEOUT_S = 30.0
RUST_LOG = "warn"
"""torchft's servers log every quorum and commit at info (to stderr): only warnings, unless the
environment asks for more (RUST_LOG, read when torchft is imported)."""


def group_of(replica_id: str) -> int:
    """The group of a torchft replica id (`replica_group_3:<uuid>` -> 3)."""
    return int(replica_id.split(":")[0].removeprefix(GROUP_PREFIX))


class _Recorded:
    """torchft's ManagerClient, keeping the last quorum result and when it arrived."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.result: Any = None
        self.formed_at = 0.0

    def _quorum(self, **kwargs: Any) -> Any:
        self.result = self._client._quorum(**kwargs)
        self.formed_at = time.perf_counter()
        return self.result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class TorchftReplicas:
    def __init__(self, place: ReplicaPlace, *, rank: int, world_size: int, store_addr: str, store_port: int,
                 lighthouse: str, backend: str, replica_min: int, timeout_s: float, collective_timeout_s: float,
                 state: StateFns) -> None:
        os.environ.setdefault("RUST_LOG", RUST_LOG)
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.place = place
        self._save, self._load = state
        self._received: tuple[float, int] | None = None
        pg = (ProcessGroupNCCL if backend == "nccl" else ProcessGroupGloo)(timeout=timedelta(seconds=timeout_s))
        self._manager = Manager(
            pg=pg, load_state_dict=self._install, state_dict=self._save, min_replica_size=replica_min,
            use_async_quorum=False, timeout=timedelta(seconds=collective_timeout_s),
            quorum_timeout=timedelta(seconds=collective_timeout_s),
            connect_timeout=timedelta(seconds=CONNECT_TIMEOUT_S), rank=rank, world_size=world_size,
            store_addr=store_addr, store_port=store_port, lighthouse_addr=lighthouse,
            replica_id=f"{GROUP_PREFIX}{place.group}", init_sync=False)
        self._client = _Recorded(self._manager._client)
        self._manager._client = self._client

    def _install(self, received: dict[str, Any]) -> None:
        began = time.perf_counter()
        self._load(received)
        self._received = (time.perf_counter() - began, _tensor_bytes(received))

    def quorum(self) -> Quorum:
        self._received = None
        try:
            self._manager.start_quorum()
        except Exception as e:  # noqa: BLE001 - torchft's quorum timeout and lighthouse errors, as one kind
            raise QuorumFailed(f"no quorum of replica groups: {type(e).__name__}: {e}") from e
        r = self._client.result
        ids = list(r.replica_ids)
        heal = None
        if r.heal and self._received is not None and r.recover_src_replica_rank is not None:
            installed_s, received_bytes = self._received
            heal = Heal(group_of(ids[r.recover_src_replica_rank]),
                        round(time.perf_counter() - self._client.formed_at, 3), received_bytes)
        elif r.heal:
            raise QuorumFailed(f"replica group {self.place.group} could not heal: {self._manager.errored()}")
        return Quorum(tuple(sorted(group_of(i) for i in ids)), self._manager.current_step(), heal)

    def sum_(self, tensor: torch.Tensor) -> None:
        from torch.distributed import ReduceOp

        self._manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()

    def errored(self) -> bool:
        return self._manager.errored() is not None

    def commit(self) -> bool:
        return bool(self._manager.should_commit())

    def abandon(self, reason: str) -> None:
        self._manager.report_error(RuntimeError(reason))
        self._manager.should_commit()

    def set_step(self, step: int) -> None:
        self._manager.load_state_dict({"step": step, "batches_committed": step * self.place.groups})

    def close(self) -> None:
        self._manager.shutdown(wait=False)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a received state (dicts and lists of them)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0
