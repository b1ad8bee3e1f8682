"""bench/memory_table.py's measurements at tiny dimensions (the same code the table runs at 8B), and
its arithmetic. The byte counts are exact, so the expectations are too."""

from dataclasses import replace

import pytest

from tests.unit.bench.conftest import load_bench

mt = load_bench("memory_table")

TINY = replace(mt.LLAMA3_8B, vocab_size=1000, hidden_size=256, intermediate_size=896, num_heads=8, num_kv_heads=2)


@pytest.fixture(scope="module")
def layer():
    return mt.bf16_layer(TINY)


def test_checkpointing_keeps_only_the_layers_input(layer):
    for seq in (32, 64):
        measured = mt.measure_layer(layer, TINY, seq, checkpointed=True, masked=True)
        assert measured.per_layer == seq * TINY.hidden_size * 2  # x in bf16
        # cos and sin (bf16, seq x head_dim each) and the boolean mask, once per forward
        assert measured.shared == 2 * seq * 32 * 2 + seq * seq


def test_without_checkpointing_bytes_grow_linearly_except_the_masks_bf16_copy(layer):
    causal = {s: mt.measure_layer(layer, TINY, s, False, False).per_layer for s in (32, 64, 128)}
    masked = {s: mt.measure_layer(layer, TINY, s, False, True).per_layer for s in (32, 64, 128)}
    assert mt.fit(causal).quadratic == pytest.approx(0, abs=1e-9)
    assert len({b / s for s, b in causal.items()}) == 1
    assert mt.fit(masked).quadratic == pytest.approx(2.0)  # SDPA's additive mask: s x s bf16 per layer
    assert mt.fit(masked).linear == pytest.approx(mt.fit(causal).linear)
    assert causal[64] / 64 > 20 * TINY.hidden_size * 2  # far more than checkpointing keeps


def test_ours_keeps_more_than_transformers_by_the_repeated_keys_and_values(layer):
    pytest.importorskip("transformers")
    seq = 64
    ours = mt.measure_layer(layer, TINY, seq, False, False).per_layer
    theirs = mt.measure_hf_layer(TINY, seq)
    head_dim = TINY.hidden_size // TINY.num_heads
    # We repeat_interleave k and v to every query head before SDPA; transformers passes enable_gqa.
    assert ours - theirs == seq * 2 * (TINY.num_heads - TINY.num_kv_heads) * head_dim * 2


def test_the_loss_keeps_fp32_log_probabilities_and_peaks_at_three_fp32_copies():
    seq = 32
    head = mt.measure_head(TINY, seq)
    v = TINY.vocab_size
    # The final norm's fp32 copy of x, its 1/rms per token, its bf16 result, and lm_head's input (the weighted result).
    assert head.head_saved == seq * (TINY.hidden_size * (4 + 2 + 2) + 4)
    assert head.loss_saved == pytest.approx(seq * (4 * v + 8), abs=64)  # log-probs + int64 targets
    assert 3 * 4 * v * seq <= head.loss_peak <= 4 * 4 * v * seq


def test_the_table_adds_states_transients_and_activations():
    p = mt.param_bytes(mt.LLAMA3_8B, 8)
    assert p.params == mt.LLAMA3_8B_PARAMS
    assert p.states == 16 * 8_030_261_248 / 8
    assert p.root_bf16 == 2 * (2 * 128256 * 4096 + 4096)
    assert p.layer_bf16 == 2 * 218_112_000
    a = mt.Activations(layer=mt.Growth(1000.0, 2.0), layer_checkpointed=mt.Growth(10.0, 0.0),
                       shared=mt.Growth(1.0, 1.0), head_saved=mt.Growth(5.0, 0.0), loss_peak=mt.Growth(100.0, 0.0))
    seq = 100
    off = mt.memory_row(p, a, layers=32, seq=seq, micro=2, checkpointed=False)
    on = mt.memory_row(p, a, layers=32, seq=seq, micro=2, checkpointed=True)
    assert off.activations == 2 * (32 * (1000 * seq + 2 * seq**2) + seq + seq**2)
    assert on.activations == 2 * (32 * 10 * seq + 1000 * seq + 2 * seq**2 + seq + seq**2)
    assert off.head == on.head == 2 * 105 * seq
    assert off.fsdp == p.root_bf16 + p.head_grad_bf16 + 5 * p.layer_bf16
    assert off.end_of_backward == p.states + 4 * p.root_bf16  # root weights, bf16 grads, their fp32 copy
    assert off.peak == max(off.states + off.fsdp + off.activations + off.head, off.end_of_backward)
    big = mt.memory_row(p, a, layers=32, seq=4096, micro=4, checkpointed=False)
    assert big.peak == big.states + big.fsdp + big.activations + big.head > big.end_of_backward
    assert mt.verdict(70.0, 80.0) == "fits" and mt.verdict(75.0, 80.0).startswith("tight")
    assert mt.verdict(81.0, 80.0) == "does not fit"
