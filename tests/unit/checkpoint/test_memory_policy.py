"""The memory tier's decisions: its cadence, its size per node, whether it fits, a resume's source."""

import pytest

from resilient_slurm.checkpoint.memory_policy import SOURCES, fits, memory_due, node_need
from resilient_slurm.checkpoint.nodes import Spread


@pytest.mark.parametrize("step, every, due", [(10, 5, True), (11, 5, False), (5, 0, False), (1, 1, True)])
def test_a_save_is_due_every_n_steps(step, every, due):
    assert memory_due(step, every) is due


def test_each_node_holds_its_ranks_shares_and_its_buddy_copies_once_per_kept_checkpoint_plus_one():
    spread = Spread(("a", "a", "b", "b"))  # a's ranks copy to b's, b's to a's
    shares = [100, 200, 10, 20]
    assert node_need(shares, spread, keep_last=1) == {"a": 2 * (300 + 30), "b": 2 * (30 + 300)}
    assert node_need(shares, spread, keep_last=2) == {"a": 3 * 330, "b": 3 * 330}
    assert node_need([7, 8], Spread(("a", "a")), keep_last=1) == {"a": 2 * 15}  # one node: no buddy copies
    three = node_need([1, 10, 100], Spread(("a", "b", "c")), keep_last=1)  # a -> b -> c -> a
    assert three == {"a": 2 * (1 + 100), "b": 2 * (10 + 1), "c": 2 * (100 + 10)}


def test_a_tier_fits_when_both_the_filesystem_and_the_memory_have_room():
    assert fits("n1", 10, free=10, available=11, where="/dev/shm/x") is None
    short = fits("n1", 3_000_000_000, free=2_000_000_000, available=50_000_000_000, where="/dev/shm/x")
    assert short == ("checkpoint.memory.every_steps: node n1 needs 3.00 GB of host memory for the memory tier but "
                     "checkpoint.memory.dir=/dev/shm/x has 2.00 GB free and MemAvailable is 50.00 GB; set "
                     "checkpoint.memory.every_steps=0, point checkpoint.memory.dir at a larger tmpfs, or remove old "
                     "runs' tiers (python -m resilient_slurm.checkpoint.memory_files clean DIR)")
    assert fits("n1", 10, free=100, available=9, where="/d") is not None


def test_a_resume_names_where_its_files_came_from():
    assert (SOURCES["hot"], SOURCES["peers"], SOURCES["buddy"]) == ("memory", "memory", "buddy")
