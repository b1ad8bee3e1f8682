import torch

from resilient_slurm.config import DataConfig
from resilient_slurm.workload.data import (
    BOS,
    EOS,
    FIRST_ITEM,
    SEP,
    TASK_TOKEN,
    TRAIN_SPLIT,
    VAL_SPLIT,
    GlobalBatchSampler,
    collate,
    make_sample,
)
from resilient_slurm.workload.model import IGNORE_INDEX

CFG = DataConfig(seq_len=48, global_batch_size=8, micro_batch_size=2, num_samples=50, min_items=3, max_items=8)


def test_samples_are_a_pure_function_of_seed_split_index():
    assert make_sample(CFG, 1, TRAIN_SPLIT, 7) == make_sample(CFG, 1, TRAIN_SPLIT, 7)
    assert make_sample(CFG, 1, TRAIN_SPLIT, 7) != make_sample(CFG, 1, VAL_SPLIT, 7)


def test_each_task_computes_the_right_answer():
    seen = set()
    for i in range(200):
        s = make_sample(CFG, 0, TRAIN_SPLIT, i)
        assert s.prompt[0] == BOS and s.prompt[1] == TASK_TOKEN[s.task] and s.prompt[-1] == SEP
        items = [t - FIRST_ITEM for t in s.prompt[2:-1]]
        out = [t - FIRST_ITEM for t in s.response[:-1]]
        assert s.response[-1] == EOS
        expected = {"copy": items, "reverse": items[::-1], "sort": sorted(items),
                    "increment": [(v + 1) % 32 for v in items]}[s.task]
        assert out == expected
        seen.add(s.task)
    assert seen == set(CFG.mix)


def test_collate_masks_the_prompt_and_padding():
    s = make_sample(CFG, 0, TRAIN_SPLIT, 0)
    inputs, targets = collate([s], CFG.seq_len)
    n_prompt, n_resp = len(s.prompt), len(s.response)
    assert inputs[0, : n_prompt + n_resp - 1].tolist() == (s.prompt + s.response)[:-1]
    trained = targets[0][targets[0] != IGNORE_INDEX].tolist()
    assert trained == s.response
    assert (targets[0, : n_prompt - 1] == IGNORE_INDEX).all()


def _stream(sampler, steps):
    out = []
    for _ in range(steps):
        out.append([torch.cat([i for i, _ in sampler.next_batch()])])
    return out


def test_sampler_resumes_exactly_from_its_position():
    a = GlobalBatchSampler(CFG, seed=5, rank=0, world_size=1)
    straight = [a.next_batch() for _ in range(20)]  # crosses epoch boundaries (50 samples, 8 per step)
    b = GlobalBatchSampler(CFG, seed=5, rank=0, world_size=1)
    for _ in range(7):
        b.next_batch()
    c = GlobalBatchSampler(CFG, seed=5, rank=0, world_size=1)
    c.state.samples_consumed = b.state.samples_consumed
    resumed = [c.next_batch() for _ in range(13)]
    for x, y in zip(straight[7:], resumed):
        assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(x, y))


def test_every_sample_seen_once_per_epoch():
    s = GlobalBatchSampler(CFG, seed=5, rank=0, world_size=1)
    seen = s.stream.indices(0, 50)
    assert sorted(seen) == list(range(50))
    assert s.stream.indices(50, 50) != seen  # a new order each epoch


def test_ranks_split_the_same_global_batch_without_overlap():
    one = GlobalBatchSampler(CFG, seed=5, rank=0, world_size=1)
    global_indices = one.stream.indices(0, CFG.global_batch_size)
    parts = [GlobalBatchSampler(CFG, seed=5, rank=r, world_size=2).rank_indices(global_indices) for r in range(2)]
    flat = [i for part in parts for micro in part for i in micro]
    assert sorted(flat) == sorted(global_indices)
    assert one.accumulation == 4 and len(parts[0]) == 2
