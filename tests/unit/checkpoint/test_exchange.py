"""The ranks' agreement on a save's plan: one small all-gather when the layout is the one the cached
plan was made for, the descriptions exchanged once more when it changes."""

import torch

from resilient_slurm.checkpoint import exchange
from resilient_slurm.checkpoint.state import OptimizerGroup, Snapshot, held


class Counting:
    """One rank's collectives, counting the all-gathers and what they carried."""

    rank, world_size = 0, 1

    def __init__(self):
        self.gathers = []

    def barrier(self):
        pass

    def all_gather_object(self, obj):
        self.gathers.append(obj)
        return [obj]


def snap(names, lr=0.1):
    return Snapshot({n: held(torch.zeros(4), n) for n in names}, {}, {}, {},
                    (OptimizerGroup(tuple(names), {"lr": lr}),), "AdamW")


def test_a_steady_layout_costs_one_small_all_gather_and_a_new_one_two():
    exchange._CACHE.clear()
    comm = Counting()
    first = exchange.agree(snap(["a", "b"]), comm, 1 << 30)
    assert first.exchanged and len(comm.gathers) == 2
    again = exchange.agree(snap(["a", "b"], lr=0.05), comm, 1 << 30)
    assert not again.exchanged and len(comm.gathers) == 3
    sig, hypers, cached = comm.gathers[-1]
    # a hash, the hyper-parameters and the digests of the plans this rank has cached, nothing else
    assert len(sig) == 64 and hypers == [{"lr": 0.05}] and len(cached) == 1 and len(next(iter(cached))) == 64
    # this step's learning rate goes into optimizer.json, though the plan is the cached one
    assert again.optimizer_json == {"type": "AdamW", "param_groups": [{"params": ["a", "b"], "lr": 0.05}]}
    changed = exchange.agree(snap(["a", "b", "c"]), comm, 1 << 30)
    assert changed.exchanged and len(comm.gathers) == 5
    assert [s.name for s in changed.plan.specs["model"]] == ["a", "b", "c"]


class Peer(Counting):
    """Rank 0 of two whose peer gives the same description and has cached `peer_cached`."""

    world_size = 2

    def __init__(self, peer_cached):
        super().__init__()
        self.peer_cached = peer_cached

    def all_gather_object(self, obj):
        self.gathers.append(obj)
        if isinstance(obj, tuple):
            return [obj, (obj[0], obj[1], self.peer_cached)]
        return [obj, None]


def test_a_rank_whose_peer_lost_its_cache_exchanges_with_it():
    """A peer restarted in its process (or a replacement) has no cached plan: both exchange, so
    their collectives stay paired (found on the sandbox: a survivor took the restarted rank's
    description gather for the next collective)."""
    exchange._CACHE.clear()
    exchange.agree(snap(["a", "b"]), Peer(frozenset()), 1 << 30)  # the plan for these two ranks, cached here
    comm = Peer(frozenset())
    assert exchange.agree(snap(["a", "b"]), comm, 1 << 30).exchanged and len(comm.gathers) == 2
    comm = Peer(frozenset(exchange._CACHE))
    assert not exchange.agree(snap(["a", "b"]), comm, 1 << 30).exchanged and len(comm.gathers) == 1
