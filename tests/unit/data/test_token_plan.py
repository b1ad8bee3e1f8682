"""The block plan: realized shares over any 1,000 consecutive global batches, exact counting."""

import numpy as np
import pytest

from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.plan import BLOCK, BlockPlan


@pytest.mark.parametrize("weights", [[0.7, 0.2, 0.1], [1, 1, 1], [0.999, 0.001], [5, 3, 1, 1, 0.25], [1]])
@pytest.mark.parametrize("global_batch", [1, 8, 32])
def test_every_1000_consecutive_global_batches_hold_each_source_within_1_percent(weights, global_batch):
    plan = BlockPlan([f"s{i}" for i in range(len(weights))], weights)
    span = 1000 * global_batch
    shares = np.asarray(weights) / sum(weights)
    # Windows at the start, inside a block, across a block boundary, and far into the run.
    for start in (0, 12_345, BLOCK - span // 2, 7 * BLOCK + 999, 10**9):
        source, _ = plan.locate(np.arange(start, start + span))
        realized = np.bincount(source, minlength=len(weights)) / span
        assert np.abs(realized - shares).max() < 0.01, (start, realized, shares)


def test_counters_number_each_sources_sequences_without_gaps_and_match_consumed():
    plan = BlockPlan(["a", "b", "c"], [0.5, 0.3, 0.2])
    source, counter = plan.locate(np.arange(3 * BLOCK + 77))
    for s in range(3):
        assert counter[source == s].tolist() == list(range(int((source == s).sum())))
    assert plan.consumed(3 * BLOCK + 77).tolist() == np.bincount(source, minlength=3).tolist()
    assert plan.consumed(0).tolist() == [0, 0, 0]


def test_a_weight_below_the_plans_resolution_is_refused_naming_the_source():
    with pytest.raises(TokenDataError, match=r"data.sources\[rare\].weight: 1e-06 is below 1/65536"):
        BlockPlan(["web", "rare"], [1.0, 1e-6])
