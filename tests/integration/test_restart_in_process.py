"""A rank that restarts in its own process (a driven step's survivor) after a peer died inside a
vocab-parallel embedding: tensor parallelism shards the embedding by rows, and the forward leaves
a mask in the op's cached placement until the all-reduce that ends it. A peer lost in that
all-reduce leaves the mask behind; the next process group in the same process must not meet it
(a CI run of the TP x HSDP spare test crashed with "MaskBuffer has been materialized with
conflicting data"). Two real gloo processes; the dead peer is the all-reduce never run."""

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from resilient_slurm.session.distributed import Comm, RankInfo
from tests.ports import free_port

WORLD = 2
WEIGHT = torch.arange(40.0).view(10, 4)  # 10 rows: 5 on each rank


def _embed(ids: torch.Tensor) -> DTensor:
    mesh = init_device_mesh("cpu", (WORLD,))
    return F.embedding(DTensor.from_local(ids, mesh, [Replicate()]), distribute_tensor(WEIGHT, mesh, [Shard(0)]))


def _worker(rank: int, ports: tuple[int, int]) -> None:
    comm = Comm(RankInfo(rank, WORLD, rank, "127.0.0.1", ports[0]))
    _embed(torch.tensor([[1, 7]]))  # the partial output, never reduced: the peer "died" first
    comm.close()
    comm = Comm(RankInfo(rank, WORLD, rank, "127.0.0.1", ports[1]))  # the restart, in this process
    ids = torch.tensor([[2, 3]])  # another batch: another mask
    assert torch.equal(_embed(ids).full_tensor(), WEIGHT[ids])
    comm.close()


def test_a_restart_in_the_process_does_not_meet_the_last_groups_embedding_mask():
    mp.spawn(_worker, args=((free_port(), free_port()),), nprocs=WORLD, join=True)
