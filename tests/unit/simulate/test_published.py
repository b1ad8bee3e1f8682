"""Checked against published data: the Llama 3 paper's 54 days on 16,384 H100s, 466 interruptions
(419 unexpected, 47 planned), "higher than 90%" effective training time. `bench/simulate.py`
prints the full comparison; this keeps the headline from drifting."""

import pytest

from resilient_slurm.simulate.results import simulate
from resilient_slurm.simulate.scenario import LLAMA3, STRATEGIES


def test_llama3_interruptions_and_effective_training_time():
    summary, _ = simulate(LLAMA3, STRATEGIES["spares"], seeds=3)
    counts = summary.mean_counts("interruptions")
    unexpected = sum(v for k, v in counts.items() if k != "planned stop")
    # More training time than Meta's run had means a few more failures; recurrences add some.
    assert unexpected == pytest.approx(419, rel=0.12)
    assert counts["planned stop"] == pytest.approx(47, rel=0.35)
    assert 0.87 <= summary.goodput <= 0.95  # published: > 90%
