import numpy as np
import pytest

from resilient_slurm.model.decoder import IGNORE_INDEX as MODEL_IGNORE_INDEX
from resilient_slurm.data.packing import IGNORE_INDEX, fit_length, labels_and_positions, pack


def test_rows_hold_whole_documents_within_seq_len_in_a_fixed_order():
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, 65, size=500)]
    rows = pack(lengths, 64)
    assert sorted(d for row in rows for d in row) == list(range(500))  # every document exactly once
    assert all(sum(lengths[d] for d in row) <= 64 for row in rows)
    assert pack(lengths, 64) == rows
    assert sum(lengths) / (64 * len(rows)) > 0.9  # best fit fills rows well


def test_a_small_window_still_packs_everything():
    lengths = [5, 60, 5, 60, 30, 30]
    rows = pack(lengths, 64, window=1)
    assert sorted(d for row in rows for d in row) == list(range(6))


@pytest.mark.parametrize("length, overlong, kept", [(10, "drop", 10), (16, "drop", 16), (17, "drop", 0),
                                                    (17, "truncate", 16)])
def test_fit_length(length, overlong, kept):
    assert fit_length(length, 16, overlong) == kept


def test_labels_are_shifted_and_never_cross_a_document_or_reach_padding():
    tokens = np.array([[10, 11, 12, 13, 20, 21, 22, 0, 0]])
    docs = np.array([[0, 0, 0, 0, 1, 1, 1, -1, -1]])
    loss = np.array([[0, 0, 1, 1, 1, 1, 1, 0, 0]])  # the second document's first token is a target too
    labels, positions = labels_and_positions(tokens, docs, loss)
    assert labels.tolist() == [[IGNORE_INDEX, 12, 13, IGNORE_INDEX, 21, 22, IGNORE_INDEX, IGNORE_INDEX,
                                IGNORE_INDEX]]
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1]]
    assert IGNORE_INDEX == MODEL_IGNORE_INDEX
