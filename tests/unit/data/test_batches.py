import numpy as np
import pytest
import torch

from resilient_slurm.config import DataConfig
from resilient_slurm.data.batches import Batch, PackedBatchSampler, PackedRows
from resilient_slurm.model.decoder import block_causal_mask
from resilient_slurm.data.packing import IGNORE_INDEX

SEQ = 16
CFG = DataConfig(path="x", seq_len=SEQ, global_batch_size=8, micro_batch_size=2)


def rows(n=21):
    """n rows whose first token is the row's index, so batches show which rows they hold."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(10, 100, size=(n, SEQ)).astype(np.int32)
    tokens[:, 0] = np.arange(n)
    docs = np.repeat(np.array([[0] * 6 + [1] * 7 + [-1] * 3]), n, axis=0).astype(np.int32)
    loss = (rng.random((n, SEQ)) < 0.5).astype(np.uint8)
    return PackedRows(tokens, docs, loss)


def global_batches(world, steps, start=0):
    """Each step's global batch, rebuilt from every rank's micro-batches in the m*world+r order."""
    samplers = [PackedBatchSampler(rows(), CFG, seed=3, rank=r, world_size=world) for r in range(world)]
    for s in samplers:
        s.state.samples_consumed = start
    out = []
    for _ in range(steps):
        per_rank = [s.next_batch() for s in samplers]
        micro = [per_rank[r][m] for m in range(samplers[0].accumulation) for r in range(world)]
        out.append(torch.cat([b.input_ids for b in micro]))
    return out


def test_one_and_two_ranks_see_the_same_global_batches_in_the_same_order():
    one, two = global_batches(1, 7), global_batches(2, 7)  # 56 rows: crosses two epochs of 21
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    assert sorted(torch.cat(one)[:21, 0].tolist()) == list(range(21))  # each row once per epoch


def test_a_resume_continues_at_the_exact_row_at_any_world_size():
    straight = global_batches(1, 6)
    for world in (1, 2, 4):
        resumed = global_batches(world, 3, start=3 * CFG.global_batch_size)
        assert all(torch.equal(a, b) for a, b in zip(straight[3:], resumed))


def test_a_step_redone_at_a_smaller_micro_batch_gets_the_same_rows_and_moves_on_once():
    samplers = [PackedBatchSampler(rows(), CFG, seed=3, rank=r, world_size=2) for r in range(2)]
    first = [s.next_batch() for s in samplers]  # micro-batch 2: two per rank
    for s in samplers:
        s.set_micro_batch_size(1)
    again = [s.batch_at(0) for s in samplers]  # the same global batch, cut in rows of 1
    assert [s.accumulation for s in samplers] == [4, 4] and all(len(b) == 4 for b in again)
    rows_of = lambda per_rank: sorted(t for b in per_rank for m in b for t in m.input_ids[:, 0].tolist())  # noqa: E731
    assert rows_of(again) == rows_of(first) and len(rows_of(first)) == CFG.global_batch_size
    assert all(s.state.samples_consumed == CFG.global_batch_size for s in samplers)  # not moved twice
    assert rows_of([s.next_batch() for s in samplers]) == rows_of([s.batch_at(8) for s in samplers])


def test_a_global_batch_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="global_batch_size"):
        PackedBatchSampler(rows(), CFG, seed=3, rank=0, world_size=3)


def test_a_batch_has_shifted_labels_restarting_positions_and_document_ids():
    r = rows()
    b = r.batch([4, 2])
    assert all(t.dtype == torch.int64 and t.shape == (2, SEQ) for t in
               (b.input_ids, b.labels, b.position_ids, b.document_ids))
    assert b.input_ids[:, 0].tolist() == [4, 2]
    assert b.position_ids[0].tolist() == [*range(6), *range(7), 0, 1, 2]
    assert b.document_ids[0].tolist() == [0] * 6 + [1] * 7 + [-1] * 3
    assert b.labels[0, 5] == IGNORE_INDEX and (b.labels[0, 12:] == IGNORE_INDEX).all()  # document ends, padding
    targets = np.flatnonzero(np.asarray(r.loss[4, 1:6]))
    assert b.labels[0, targets].tolist() == b.input_ids[0, targets + 1].tolist()


def test_no_token_attends_across_documents():
    b = rows().batch([0])
    mask = block_causal_mask(b.document_ids)[0, 0]
    assert mask.shape == (SEQ, SEQ) and mask.dtype == torch.bool
    assert mask[:6, :6].equal(torch.ones(6, 6, dtype=torch.bool).tril())
    assert not mask[6:13, :6].any() and not mask[:6, 6:].any() and not mask[13:, :13].any()
    assert mask.any(dim=-1).all()  # every query, padding included, attends somewhere
    # Attention with this mask: a document's outputs do not change when the other document does.
    q = k = v = torch.randn(1, 1, SEQ, 4)
    v2 = v.clone()
    v2[..., :6, :] += 1.0
    f = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(f(q, k, v, attn_mask=mask)[..., 6:13, :], f(q, k, v2, attn_mask=mask)[..., 6:13, :])


def test_to_moves_every_tensor():
    b = rows().batch([1]).to("cpu")
    assert isinstance(b, Batch) and b.input_ids.device.type == "cpu"
