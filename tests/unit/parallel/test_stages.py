"""Pipeline stages cut by layer and placed on ranks (config/parallel.py), and the interleaved
schedule's rule on micro-batches, checked against torch's own schedule."""

import pytest

from resilient_slurm.config.parallel import interleaved_problem, rank_stages, stage_layers


@pytest.mark.parametrize("layers, stages, expected", [
    (2, 2, [[0], [1]]),
    (4, 2, [[0, 1], [2, 3]]),
    (5, 2, [[0, 1, 2], [3, 4]]),          # 7 units: 4 + 3, the embedding and the head one each
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),  # 10 units: 4 + 3 + 3
    (6, 4, [[0], [1, 2], [3, 4], [5]]),    # 8 units, 2 a stage: the end stages give one to their weights
    (3, 3, [[0], [1], [2]]),               # 5 units would leave the last stage only the head: layers alone
    (4, 4, [[0], [1], [2], [3]]),
    (7, 1, [list(range(7))]),
])
def test_stages_hold_consecutive_layers_balanced_with_the_embedding_and_head_as_layers(layers, stages, expected):
    cut = stage_layers(layers, stages)
    assert [list(r) for r in cut] == expected
    assert [i for r in cut for i in r] == list(range(layers))


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="every stage needs a layer"):
        stage_layers(2, 3)


def test_ranks_run_stages_in_loop_order():
    assert [rank_stages(r, 2, 2) for r in range(2)] == [[0, 2], [1, 3]]
    assert [rank_stages(r, 4, 1) for r in range(4)] == [[0], [1], [2], [3]]
    assert rank_stages(3, 4, 3) == [3, 7, 11]


@pytest.mark.parametrize("micro_batches, pp", [(2, 2), (3, 2), (4, 2), (5, 2), (6, 4), (9, 4), (10, 4), (7, 3)])
def test_the_interleaved_rule_is_torchs(micro_batches, pp):
    """What ScheduleInterleaved1F1B's constructor refuses, we refuse before torch starts."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    class Stage:  # what the constructor reads of its stages, before any communication
        group_size, group_rank, num_stages = pp, 0, 2 * pp
        stage_index_to_group_rank: dict = {}

    try:
        ScheduleInterleaved1F1B([Stage(), Stage()], micro_batches)  # type: ignore[list-item]
        refused = False
    except ValueError as e:
        refused = "multiple of the number of rounds" in str(e)
    problem = interleaved_problem(micro_batches, pp)
    assert (problem is not None) == refused
    if problem:
        assert problem.startswith("parallel.pp_schedule: interleaved_1f1b") and "\n" not in problem
