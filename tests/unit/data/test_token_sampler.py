"""The token sampler: one global order at every world size, exact resume from the position record,
data phases, refusals on changed data, exhausted sources, document masks."""

import json

import numpy as np
import pytest
import torch

from resilient_slurm.data.tokens.errors import SourceExhausted, TokenDataError
from resilient_slurm.data.tokens.sampler import metrics_row
from resilient_slurm.data.tokens.token_data import open_token_data
from resilient_slurm.data.packing import IGNORE_INDEX
from tests.token_corpora import numbered_docs, token_config, two_sources, write_prefix


def global_batches(data, world, steps, saved=None, micro=1):
    """Each step's global batch rebuilt from every rank's micro-batches (chunk m*world+r), and the
    samplers' positions after them."""
    samplers = [data.sampler(r, world) for r in range(world)]
    for s in samplers:
        s.set_micro_batch_size(micro)
        s.restore(saved)
    out = []
    for _ in range(steps):
        per_rank = [s.next_batch() for s in samplers]
        micro_batches = [per_rank[r][m] for m in range(samplers[0].accumulation) for r in range(world)]
        out.append(torch.cat([torch.stack([b.input_ids, b.labels, b.position_ids, b.document_ids])
                              for b in micro_batches], dim=1))
    return out, [s.position() for s in samplers]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def data(tmp_path):
    return open_token_data(token_config(two_sources(tmp_path), document_mask=True))


def test_world_sizes_1_2_and_4_see_the_same_global_batches(data):
    one, _ = global_batches(data, 1, 12)
    assert same(one, global_batches(data, 2, 12)[0]) and same(one, global_batches(data, 4, 12)[0])
    assert same(one, global_batches(data, 2, 12, micro=2)[0]) and same(one, global_batches(data, 4, 12, micro=2)[0])


@pytest.mark.parametrize("before, after", [(1, 1), (2, 2), (2, 1), (1, 2), (2, 4)])
def test_a_resume_from_the_position_record_continues_exactly(data, before, after):
    straight, _ = global_batches(data, 1, 10)
    first, positions = global_batches(data, before, 4)
    assert all(p == positions[0] for p in positions)  # every rank holds the same position
    saved = json.loads(json.dumps(positions[0]))  # as train_state.json stores it
    resumed, _ = global_batches(data, after, 6, saved)
    assert same(straight, first + resumed)


def test_the_order_is_a_function_of_its_inputs_and_the_seed_changes_it(tmp_path):
    sources = two_sources(tmp_path)
    a = open_token_data(token_config(sources)).sampler(0, 1).stream.indices(0, 64)
    b = open_token_data(token_config(sources)).sampler(0, 1).stream.indices(0, 64)
    cfg = token_config(sources)
    cfg.train.seed += 1
    c = open_token_data(cfg).sampler(0, 1).stream.indices(0, 64)
    assert a == b and a != c


def test_validation_windows_are_held_out_of_every_epoch(data):
    for order in data.orders:
        val = set(np.asarray(order.val).tolist())
        assert len(val) == 4 == data.val[order.source.name].num_rows
        for e in range(2):
            epoch = np.asarray(order.epoch(e)).tolist()
            assert sorted(epoch) == sorted(set(range(order.windows)) - val)
    batch = data.val["web"].batch([0, 3])
    assert batch.input_ids.shape == (2, 16)


def test_realized_shares_are_recorded_per_source(tmp_path):
    cfg = token_config(two_sources(tmp_path), global_batch_size=10)
    sampler = open_token_data(cfg).sampler(0, 1)
    for _ in range(50):
        sampler.next_batch()
    pos = sampler.position()
    assert pos["sequences"] == 500
    assert abs(pos["sources"]["web"]["share"] - 0.7) < 0.01 and pos["sources"]["web"]["tokens"] == \
        pos["sources"]["web"]["trained"] * 16
    assert pos["sources"]["code"]["file"].endswith("code.bin") and pos["sources"]["code"]["token"] >= 0
    row = metrics_row(pos)
    assert row["data/web/share"] == pos["sources"]["web"]["share"] and row["data/code/epoch"] == 0
    assert row["data/web/tokens"] + row["data/code/tokens"] == 500 * 16


def test_a_source_that_runs_out_repeats_in_a_new_order_or_stops_the_run(tmp_path):
    sources = [(n, p, 0.5) for n, p, _ in two_sources(tmp_path)]  # code has half web's windows
    cfg = token_config(sources, global_batch_size=10)
    data = open_token_data(cfg)
    sampler = data.sampler(0, 1)
    code = data.orders[1]
    steps = code.train_windows // 5 + 2  # code gets 5 of every 10
    changes = []
    for _ in range(steps):
        at = sampler.state.samples_consumed
        sampler.next_batch()
        changes += sampler.epoch_changes(at, sampler.state.samples_consumed)
    assert changes == [("code", 1)] and sampler.position()["sources"]["code"]["epoch"] == 1
    assert not np.array_equal(code.epoch(0), code.epoch(1))
    cfg.data.on_exhausted = "stop"
    stopping = open_token_data(cfg).sampler(0, 1)
    with pytest.raises(SourceExhausted, match="data source code is exhausted"):
        for _ in range(steps):
            stopping.next_batch()


def test_a_new_data_phase_begins_at_the_saved_position_and_continues_each_kept_source(tmp_path):
    sources = two_sources(tmp_path)
    data = open_token_data(token_config(sources))
    _, positions = global_batches(data, 1, 5)
    saved = positions[0]
    math = write_prefix(tmp_path / "math", numbered_docs(100, 9))
    anneal = token_config([("web", sources[0][1], 0.2), ("math", math, 0.8)], phase="anneal")
    sampler = open_token_data(anneal).sampler(0, 1)
    assert sampler.restore(saved).name == "anneal"
    pos = sampler.position()
    assert pos["phase"]["start"] == 40 and [h["name"] for h in pos["history"]] == ["main"]
    assert pos["history"][0]["end"] == 40
    web = {s["name"]: s for s in pos["phase"]["sources"]}["web"]
    assert web["base"] == saved["sources"]["web"]["counter"] > 0  # web goes on where it stood
    seen_web = set(data.sampler(0, 1).stream.picks(0, 40)[i][1] for i in range(40)
                   if data.sampler(0, 1).stream.picks(0, 40)[i][0] == 0)
    later = [w for s, w in sampler.stream.picks(40, 40) if s == 0]
    assert later and not seen_web & set(later)  # not replayed
    again = open_token_data(anneal).sampler(0, 1)
    assert again.restore(json.loads(json.dumps(pos))) is None  # resuming inside the phase: no new one
    assert again.stream.picks(40, 8) == sampler.stream.picks(40, 8)


def test_changed_files_or_weights_are_refused_naming_the_source(tmp_path):
    sources = two_sources(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    cfg = token_config(sources)
    saved = global_batches(open_token_data(cfg, run), 1, 2)[1][0]
    reweighted = token_config([(n, p, 0.5) for n, p, _ in sources])
    with pytest.raises(TokenDataError, match=r"data.sources\[web\].weight: 0.7 -> 0.5 since data phase 'main'"):
        open_token_data(reweighted, run)
    with pytest.raises(TokenDataError, match=r"data.sources\[web\].weight: 0.7 -> 0.5"):
        open_token_data(reweighted).sampler(0, 1).restore(saved)
    write_prefix(tmp_path / "web", numbered_docs(261, 1))  # one more document
    with pytest.raises(TokenDataError, match=r"data.sources\[web\]: web.bin is \d+ bytes, was \d+ since data phase"):
        open_token_data(cfg, run)
    with pytest.raises(TokenDataError, match=r"data.sources\[web\]: its files changed since data phase 'main'"):
        open_token_data(cfg).sampler(0, 1).restore(saved)
    cfg.data.phase = "more-web"  # the way out: a new phase from here
    assert open_token_data(cfg, run).sampler(0, 1).restore(saved).name == "more-web"


def test_document_mask_keeps_positions_and_labels_inside_documents(tmp_path):
    docs = [np.array([5, 6, 7, 1]), np.array([8, 9, 1]), np.array([10, 11, 12, 13, 14, 1])] * 30
    prefix = write_prefix(tmp_path / "d", docs)
    for mask in (True, False):
        data = open_token_data(token_config([("d", prefix, 1.0)], seq_len=8, document_mask=mask))
        sampler = data.sampler(0, 1)
        (b,), w = sampler.batch_at(0)[:1], sampler.stream.picks(0, 1)[0][1]
        stream = np.concatenate(docs)[w * 8:w * 8 + 9]
        assert b.input_ids[0].tolist() == stream[:8].tolist()
        if not mask:
            assert b.labels[0].tolist() == stream[1:].tolist() and b.position_ids[0].tolist() == list(range(8))
            continue
        ends = np.flatnonzero(stream[:-1] == 1)  # an EOS ends each document
        for t in range(8):
            expect = IGNORE_INDEX if t in ends else stream[t + 1]
            assert b.labels[0, t] == expect
        starts = [0, *(ends + 1)]
        assert b.position_ids[0].tolist() == [t - max(s for s in starts if s <= t) for t in range(8)]


def test_a_prepared_order_is_mapped_and_nothing_is_built_again(tmp_path):
    cfg = token_config(two_sources(tmp_path))
    first = open_token_data(cfg)
    assert first.stats.index_built and first.stats.index_seconds >= 0
    again = open_token_data(cfg)
    assert again.stats.index_built == [] and again.stats.index_seconds == 0
    assert (tmp_path / "order-index").is_dir()


def test_a_token_id_the_model_cannot_embed_is_refused_naming_the_file(tmp_path):
    prefix = write_prefix(tmp_path / "big", [np.array([3, 700, 1])] * 20)
    with pytest.raises(TokenDataError, match=r"big.bin: token id 700 is >= the model's vocabulary \(model.vocab_size=512"):
        open_token_data(token_config([("big", prefix, 1.0)], seq_len=4, val_sequences=1))
