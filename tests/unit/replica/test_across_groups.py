"""The sentinel's gather and copy across replica groups, as sums over the engine: every live
group's integers arrive exactly, a group that takes no part is absent, and a copy from one group
is the source's bits (negative zero, a NaN's payload, bfloat16). The engine is a stand-in that
sums in memory across threads (one per group), as torchft's managed all-reduce sums across
processes; nothing else is faked."""

import threading

import pytest
import torch

from resilient_slurm.replica.across_groups import by_group, copy_group
from resilient_slurm.session.replica_place import ReplicaPlace


class Summed:
    """Replicas whose `sum_` adds the tensors of the groups taking part (threads) in place."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)
        self.parts: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def engine(self, group: int, groups: int):
        hub = self

        class Engine:
            place = ReplicaPlace(group, groups, group_size=1)

            def sum_(self, t: torch.Tensor) -> None:
                with hub.lock:
                    hub.parts[group] = t.clone()
                hub.barrier.wait()
                total = sum(hub.parts.values())
                hub.barrier.wait()
                t.copy_(total)

            def errored(self) -> bool:
                return False

        return Engine()


def in_groups(live: list[int], groups: int, work):
    """`work(engine)` on one thread per live group; their results by group."""
    hub, out = Summed(len(live)), {}

    def run(g):
        out[g] = work(hub.engine(g, groups))

    threads = [threading.Thread(target=run, args=(g,)) for g in live]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_every_live_groups_values_arrive_exactly_and_an_absent_group_is_left_out():
    values = {0: torch.tensor([[1, -2], [2**62, -(2**63)]]), 2: torch.tensor([[7, 0], [-1, 5]])}
    got = in_groups([0, 2], 3, lambda e: by_group(e, e.place, values[e.place.group]))
    for g in (0, 2):
        assert set(got[g]) == {0, 2}
        for source in (0, 2):
            assert torch.equal(got[g][source], values[source])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_copy_from_one_group_is_its_bits_and_the_others_keep_theirs(dtype):
    odd = torch.tensor([-0.0, float("nan"), 1.5, -3.25], dtype=dtype)
    odd.view(torch.int32 if dtype == torch.float32 else torch.int16)[1] -= 1  # another NaN payload

    def work(e):
        g = e.place.group
        p = torch.nn.Parameter(odd.clone() if g == 0 else torch.full((4,), float(g), dtype=dtype))
        opt = torch.optim.AdamW([p])
        p.grad = torch.ones_like(p)
        opt.step()
        if g == 0:  # the source's own state, different from the others'
            opt.state[p]["exp_avg"].fill_(0.125)
            p.data.copy_(odd)
        own = p.detach().clone()
        moved = copy_group(e, e.place, [p], opt, source=0, into={1}, device=torch.device("cpu"))
        return p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}, moved, own

    out = in_groups([0, 1, 2], 3, work)
    width = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out[1][0].view(width), odd.view(width)), "group 1 took group 0's bits"
    assert torch.equal(out[1][1]["exp_avg"], out[0][1]["exp_avg"])
    assert torch.equal(out[2][0], out[2][3]) and not torch.equal(out[2][3], out[0][3]), "group 2 kept its own"
    assert out[1][2] == out[0][2] > 0
