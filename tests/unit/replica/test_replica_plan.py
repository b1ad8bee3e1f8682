"""The replica groups' pure decisions, as tables: the deal of a missing group's micro-batches, who
writes, how the live groups changed, and when going on without a group is refused."""

import pytest

from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.replica import plan
from resilient_slurm.session.replica_place import ReplicaPlace, place_from_launch


def deal(live, groups, accumulation):
    """{group: [(source, micro), ...]} for compact tables."""
    return {g: [(w.source, w.micro) for w in work] for g, work in plan.share(live, groups, accumulation).items()}


@pytest.mark.parametrize("live, groups, accumulation, expected", [
    # every group live: each its own micro-batches, nothing more
    ([0, 1], 2, 2, {0: [(0, 0), (0, 1)], 1: [(1, 0), (1, 1)]}),
    # group 1 lost: group 0 takes both of its micro-batches, after its own
    ([0], 2, 2, {0: [(0, 0), (0, 1), (1, 0), (1, 1)]}),
    ([1], 2, 1, {1: [(1, 0), (0, 0)]}),
    # three groups, one lost: its micro-batches dealt round-robin, lowest live group first
    ([0, 2], 3, 2, {0: [(0, 0), (0, 1), (1, 0)], 2: [(2, 0), (2, 1), (1, 1)]}),
    ([1, 2], 3, 3, {1: [(1, 0), (1, 1), (1, 2), (0, 0), (0, 2)], 2: [(2, 0), (2, 1), (2, 2), (0, 1)]}),
    # two of three lost
    ([2], 3, 1, {2: [(2, 0), (0, 0), (1, 0)]}),
    # the order the quorum lists them in does not matter
    ([2, 0], 3, 1, {0: [(0, 0), (1, 0)], 2: [(2, 0)]}),
])
def test_the_live_groups_compute_the_whole_global_batch(live, groups, accumulation, expected):
    got = deal(live, groups, accumulation)
    assert got == expected
    every = sorted(w for work in got.values() for w in work)
    assert every == [(g, m) for g in range(groups) for m in range(accumulation)]  # each once, none lost


def test_no_live_group_has_no_deal():
    with pytest.raises(ValueError, match="none live"):
        plan.share([], 2, 1)
    with pytest.raises(ValueError, match="out of range"):
        plan.share([2], 2, 1)


@pytest.mark.parametrize("groups, failed, joining, replica_min, refused", [
    (2, [1], [], 1, None),
    (3, [0], [], 2, None),
    (3, [0, 2], [], 1, None),
    (2, [0, 1], [], 1, "the failure took every replica group at once (2 of 2)"),
    (3, [0, 1, 2], [], 1, "the failure took every replica group at once (3 of 3)"),
    (2, [0], [1], 1, "no live replica group: group(s) 1 were still healing when the others failed"),
    (3, [0], [], 3, "2 live replica group(s), fewer than cluster.replica_min=3"),
    (3, [0], [1], 2, "1 live replica group(s), fewer than cluster.replica_min=2"),
    (4, [3], [1], 2, None),
])
def test_when_the_others_may_not_go_on(groups, failed, joining, replica_min, refused):
    assert plan.refusal(groups, failed, joining, replica_min) == refused


@pytest.mark.parametrize("live, me, refused", [
    ([0, 1], 1, None),
    ([1, 2], 2, None),
    ([1], 1, "replica group 1 has no live group to heal from (the quorum holds it alone)"),
])
def test_a_replacement_heals_only_from_another_group(live, me, refused):
    assert plan.heal_refusal(live, me) == refused


@pytest.mark.parametrize("before, after, left, joined", [
    ([0, 1], [0, 1], (), ()),
    ([0, 1], [0], (1,), ()),
    ([0], [0, 1], (), (1,)),
    ([0, 1, 2], [1, 2, 3], (0,), (3,)),
    ([], [0, 1], (), (0, 1)),
])
def test_how_the_live_groups_changed(before, after, left, joined):
    assert plan.change(before, after) == plan.Change(left, joined)


def test_the_lowest_live_group_leads():
    assert plan.leader([2, 1]) == 1 and plan.leader([0, 1]) == 0


@pytest.mark.parametrize("rank, groups, size, where", [(0, 2, 2, (0, 0)), (3, 2, 2, (1, 1)), (5, 3, 2, (2, 1))])
def test_a_global_rank_is_group_times_size_plus_its_rank_in_the_group(rank, groups, size, where):
    assert plan.place_of(rank, groups, size) == where
    assert ReplicaPlace(where[0], groups, size).global_rank(where[1]) == rank


def test_a_rank_outside_the_groups_is_refused():
    with pytest.raises(ValueError):
        plan.place_of(4, 2, 2)


def test_the_place_a_supervisor_gives_a_rank():
    told = RankLaunch(world_size=4, replica_group=1, replica_heal=True)
    assert place_from_launch(RankLaunch.from_env(told.to_env()), 2, 4) == ReplicaPlace(1, 2, 4, heal=True)
    assert place_from_launch(RankLaunch(replica_group=0), 3, 1) == ReplicaPlace(0, 3, 1, heal=False)
    with pytest.raises(ValueError, match="RESILIENT_SLURM_REPLICA_GROUP"):
        place_from_launch(RankLaunch(), 2, 1)
