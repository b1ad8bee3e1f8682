"""The fingerprint's pure parts: a checksum of the bits that any single flip changes, that does not
depend on the order of summation, and that tells swaps apart; which ranks hold a shard's copies,
who gives the third opinion, where the buddy sits; and a re-run of AdamW's update from the kept
state reproducing the real update bit for bit (what the third opinion and the buddy rely on)."""

import pytest
import torch

from resilient_slurm.config import Layout
from resilient_slurm.replica import fingerprint as fp
from resilient_slurm.replica import roles
from resilient_slurm.replica.update_rerun import KeptState, from_parcel, rerun, to_parcel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_single_bit_flip_changes_the_fingerprint(dtype):
    t = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    before = fp.fingerprint(t)
    width = t.element_size() * 8
    for element in (0, 7, 14):
        for bit in range(width):
            flipped = t.clone()
            v = fp.bits(flipped)
            v[element] ^= torch.tensor(1 << bit if bit < width - 1 else -(1 << bit), dtype=v.dtype)
            assert not torch.equal(fp.fingerprint(flipped), before), (element, bit)


def test_swaps_and_cancelling_flips_change_it_and_chunks_do_not():
    t = torch.arange(10, dtype=torch.float32)
    swapped = t.clone()
    swapped[[2, 7]] = swapped[[7, 2]]
    assert not torch.equal(fp.fingerprint(swapped), fp.fingerprint(t))
    cancel = t.clone()
    v = fp.bits(cancel)
    v[3] += 4
    v[8] -= 4  # the plain sum is the same; the position-weighted one is not
    a, b = fp.fingerprint(cancel).tolist(), fp.fingerprint(t).tolist()
    assert a[0] == b[0] and a[1] != b[1]
    big = torch.randn(fp.CHUNK + 5, generator=torch.Generator().manual_seed(1))
    by_hand = fp.bits(big).to(torch.int64)
    weights = torch.cat([torch.arange(1, 2 * fp.CHUNK, 2), torch.arange(1, 10, 2)])
    assert fp.fingerprint(big).tolist() == [int(by_hand.sum()), int((by_hand * weights).sum())]


def test_the_fingerprint_does_not_depend_on_how_the_sum_is_split():
    t = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    v = fp.bits(t).to(torch.int64)
    halves = v[:2048].sum() + v[2048:].sum()
    assert int(halves) == fp.fingerprint(t).tolist()[0]
    assert fp.fingerprints([t, t[:0]]).tolist() == [fp.fingerprint(t).tolist(), [0, 0]]


def test_replicas_of_a_shard_and_who_gives_the_other_opinions():
    lay = Layout(dp_replicate=2, dp_shard=2, tp=2, pp=1)
    assert roles.replicas_of(lay, 7) == [3, 7] and roles.shard_of(lay, 7) == 3
    assert [lay.coords(roles.rank_at(lay, *lay.coords(r).__dict__.values())) for r in range(8)] == \
        [lay.coords(r) for r in range(8)]
    nodes = ["n0", "n0", "n1", "n1", "n2", "n2"]
    assert roles.third_rank(nodes, [0, 2]) == 4           # on neither node
    assert roles.third_rank(nodes[:4], [0, 2]) == 1       # only their nodes: another device
    assert roles.third_rank(["n0", "n1"], [0, 1]) is None
    assert roles.buddy_shift(nodes) == 2 and roles.buddy_shift(["h"] * 4) == 1


def test_a_rerun_from_the_kept_state_repeats_the_update_bit_for_bit():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 8)), torch.nn.Parameter(torch.randn(8)),
              torch.nn.Parameter(torch.randn(4), requires_grad=False)]
    optimizer = torch.optim.AdamW([{"params": params[:1], "weight_decay": 0.1},
                                   {"params": params[1:], "weight_decay": 0.0}], lr=1e-2)
    kept = KeptState(optimizer, params)
    for step in range(3):
        for p in params[:2]:
            p.grad = torch.randn_like(p)
        kept.armed = step != 1  # an unarmed step keeps nothing new
        optimizer.step()
        assert kept.kept is not None
        if step == 1:
            continue
        # through the wire's packing, as a third rank receives it
        items = from_parcel(to_parcel([(k, p.grad) for k, p in zip(kept.kept, params)], {}))
        redone = [rerun(torch.optim.AdamW, before, grad, torch.device("cpu")) for before, grad in items]
        assert torch.equal(fp.fingerprints(params), fp.fingerprints([r.param for r in redone]))
        for p, r in zip(params, redone):
            for key, value in optimizer.state.get(p, {}).items():
                assert torch.equal(value, r.state[key]), key


def test_a_parcel_unpacks_to_the_tensors_it_packed_whatever_their_alignment():
    from resilient_slurm.replica.wire import Parcel, _pack, _unpack

    tensors = [torch.randn(3).to(torch.bfloat16), torch.randn(2, 2), torch.tensor(5.0), torch.empty(0)]
    back = _unpack(*_pack(Parcel({"dispute": 1}, tensors), torch.device("cpu")))
    assert back.meta == {"dispute": 1}
    assert [(t.dtype, t.shape) for t in back.tensors] == [(t.dtype, t.shape) for t in tensors]
    assert all(torch.equal(a, b) for a, b in zip(back.tensors, tensors))
