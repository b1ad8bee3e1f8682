"""A live rank's payload, sent over the wire as torchft's transport sends it (torch's streaming
serialization), installed in a fresh rank: the same weights, optimizer state, schedule, RNG and
train state, so the next step comes out bit for bit the same. Plain tensors in one process; FSDP2's
shards travel the same way (tests/integration/test_replica_groups.py)."""

import io

import pytest
import torch
from torch import nn

from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.replica import heal


def build(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def step(model, optimizer, scheduler):
    x = torch.randn(5, 6)  # from the global generator: the RNG state is part of what heals
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    with torch.no_grad():
        return model(x)


def over_the_wire(payload):
    buf = io.BytesIO()
    torch.save(payload, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_the_live_rank_serves_its_tensors_without_a_copy():
    live = build(0)
    step(*live)
    sent = heal.payload(capture_snapshot(*live, TrainState(step=1)))
    assert sent[heal.MODEL]["0.weight"].data_ptr() == live[0][0].weight.data_ptr()
    exp_avg = live[1].state[live[0][0].weight]["exp_avg"]
    assert sent[heal.OPTIMIZER]["0.weight.exp_avg"].data_ptr() == exp_avg.data_ptr()


def test_a_healed_rank_takes_the_next_step_bit_identical_to_the_live_one():
    live = build(0)
    for _ in range(3):
        step(*live)
    state = TrainState(step=3, tokens_seen=120, data_state={"samples_consumed": 12, "global_batch_size": 4})
    received = over_the_wire(heal.payload(capture_snapshot(*live, state)))
    live_out = step(*live)  # from the RNG state the payload holds

    torch.manual_seed(1234)  # the healing rank's own RNG and weights, all replaced
    fresh = build(7)
    installed = heal.install(received, *fresh)
    assert installed.train_state == state
    weights = sum(p.numel() for p in live[0].parameters())
    assert installed.bytes == 4 * weights * 3 + 4 * 4  # weights, exp_avg, exp_avg_sq, and 4 step counts
    assert torch.equal(step(*fresh), live_out)
    for a, b in zip(live[0].parameters(), fresh[0].parameters()):
        assert torch.equal(a, b)
    assert fresh[2].state_dict() == live[2].state_dict()


def test_a_payload_of_another_layout_is_refused_by_name():
    received = over_the_wire(heal.payload(capture_snapshot(*build(0), TrainState(step=1))))
    other = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    with pytest.raises(ValueError, match=r"heal: 0.weight is \[8, 6\] at the live group and \[9, 6\] here"):
        heal.install(received, other, torch.optim.AdamW(other.parameters()), None)
