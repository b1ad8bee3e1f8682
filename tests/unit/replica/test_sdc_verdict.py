"""Who is wrong when copies differ: the majority of 3+, two replicas' tie, a buddy's re-run; where
each shard heals from; the `sdc` event's evidence. The decisions are pure: these are their tables."""

import pytest

from resilient_slurm.replica.verdict import (
    RERUN,
    UNDECIDED,
    Dispute,
    Opinion,
    Ruling,
    TieFacts,
    as_hex,
    differing,
    finding,
    heal_sources,
    rule,
    settle_rerun,
    settle_tie,
)

A, B, C = (1, 2), (1, 3), (9, 9)  # three values of one tensor's fingerprint


def test_differing_names_the_tensors_whose_copies_are_not_all_equal():
    rows = [[A, A, B], [A, A, B], [A, C, B]]
    assert differing(rows) == [1]
    assert differing([[A, B]]) == [] and differing([]) == []


@pytest.mark.parametrize("values, culprits, decided", [
    ({0: (A,), 1: (A,), 2: (B,)}, (2,), True),                   # 2 of 3
    ({0: (B,), 1: (A,), 2: (A,), 3: (A,)}, (0,), True),          # 3 of 4
    ({0: (A, A), 1: (B, A), 2: (A, C)}, (1, 2), True),           # two culprits, different tensors
    ({0: (A,), 1: (B,), 2: (C,)}, (), False),                    # three values: no majority
    ({0: (A,), 1: (A,), 2: (B,), 3: (B,)}, (), False),           # a half is no majority
])
def test_the_majority_names_the_culprits(values, culprits, decided):
    ruling = rule([Opinion(r, fps) for r, fps in values.items()])
    assert ruling.culprits == culprits and ruling.decided is decided
    if decided:
        assert set(ruling.good).isdisjoint(culprits) and ruling.good


def test_a_rerun_that_comes_out_wrong_blames_the_rank_that_ran_it():
    ruling = rule([Opinion(0, (A,)), Opinion(1, (A,)), Opinion(5, (B,), rerun_of=0)], RERUN)
    assert ruling.culprits == (5,) and ruling.good == (0, 1)


def tie(**over):
    facts = dict(a=0, b=2, after={0: (A,), 2: (B,)}, before={0: (C,), 2: (C,)}, agreed=(C,),
                 grads={0: (C,), 2: (C,)}, reruns=[Opinion(1, (A,), rerun_of=0), Opinion(0, (A,), rerun_of=0),
                                                   Opinion(2, (A,), rerun_of=2)])
    return settle_tie(TieFacts(**{**facts, **over}))


@pytest.mark.parametrize("over, culprits", [
    ({}, (2,)),                                                                   # the third rank sides with 0
    ({"reruns": [Opinion(1, (B,), rerun_of=0)]}, (0,)),                           # ... or with 2
    ({"reruns": [Opinion(1, (C,), rerun_of=0)]}, ()),                             # with neither
    ({"reruns": [Opinion(0, (A,), rerun_of=0), Opinion(2, (A,), rerun_of=2)]}, (2,)),   # no third: both re-ran alike
    ({"reruns": [Opinion(0, (A,), rerun_of=0), Opinion(2, (B,), rerun_of=2)]}, ()),     # ... each its own result
    ({"before": {0: (C,), 2: (B,)}}, (2,)),                                       # 2 changed at rest before the update
    ({"before": {0: (C,), 2: (B,)}, "agreed": None}, ()),                         # ... no earlier comparison to say so
    ({"grads": {0: (C,), 2: (B,)}}, ()),                                          # the reduced gradients differ
    ({"before": None}, ()),                                                       # nothing kept (rerun_on_tie=false)
])
def test_two_replicas_are_settled_by_a_rerun_or_left_undecided(over, culprits):
    ruling = tie(**over)
    assert ruling.culprits == culprits
    assert ruling.decided is bool(culprits) and ruling.reason
    assert ruling.decided_by == (RERUN if culprits else UNDECIDED)


@pytest.mark.parametrize("third, in_place, culprits", [
    (Opinion(7, (B,), rerun_of=3), None, (3,)),    # the third rank agrees with the buddy: the rank is wrong
    (Opinion(7, (A,), rerun_of=3), None, (4,)),    # ... with the rank: the buddy's device computed wrong
    (None, (B,), (3,)),                            # no third: the rank's own re-run agrees with its buddy
    (None, (A,), ()),                              # ... repeats its own result: one of the two, every time
])
def test_a_buddys_rerun_is_settled_by_a_third_opinion(third, in_place, culprits):
    ruling = settle_rerun(3, 4, (A,), (B,), third, in_place)
    assert ruling.culprits == culprits and ruling.decided is bool(culprits)


def test_each_shard_heals_from_its_good_replica_and_the_rest_from_a_group_nobody_blamed():
    group_of = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    rulings = [(0, Ruling((2,), (0, 4), "majority", "")), (1, Ruling((5,), (1, 3), "majority", ""))]
    by_shard, default = heal_sources(rulings, 3, group_of)
    assert by_shard == {0: 0, 1: 0} and default == 0
    by_shard, default = heal_sources([(0, Ruling((0,), (2,), "rerun", "")), (1, Ruling((3,), (1,), "rerun", ""))],
                                     2, group_of)
    assert by_shard == {0: 1, 1: 0} and default is None


def test_the_sdc_event_names_the_culprit_node_and_keeps_every_copys_fingerprint():
    d = Dispute(0, (0, 2, 4), (1,), {0: (A,), 2: (A,), 4: (B,)})
    e = finding("replicas", [d], [Ruling((4,), (0, 2), "majority", "2 of 3 copies agree")], [], ["w0", "w1"],
                ["n0", "n0", "n1", "n1", "n2", "n2"], "group 0", 0.25, True)
    assert (e.ranks, e.nodes, e.tensors, e.action, e.decided_by) == ([4], ["n2"], ["w1"], "healed", "majority")
    assert [(x["rank"], x["group"], x["node"], x["fingerprint"]) for x in e.evidence] == \
        [(0, 0, "n0", as_hex(A)), (2, 1, "n1", as_hex(A)), (4, 2, "n2", as_hex(B))]
    undecided = finding("replicas", [d], [Ruling((), (), UNDECIDED, "no majority")], [], ["w0", "w1"],
                        ["n0", "n0", "n1", "n1", "n2", "n2"], None, 0.1, False)
    assert undecided.action == UNDECIDED and undecided.ranks == [] and undecided.suspects == ["n0", "n1", "n2"]
    assert as_hex((-1, 1)) == "ffffffffffffffff0000000000000001"


def test_across_replica_groups_the_evidence_names_each_copys_own_group_while_one_is_away():
    # groups of 2 ranks; group 1 (ranks 2, 3) is out of this step's quorum: rank 1's shard is held by
    # ranks 1, 5 and 7, in groups 0, 2 and 3 (positions 0, 1 and 2 among the live ones)
    d = Dispute(1, (1, 5, 7), (0,), {1: (A,), 5: (B,), 7: (A,)})
    e = finding("replicas", [d], [Ruling((5,), (1, 7), "majority", "2 of 3 copies agree")], [], ["w0"],
                [f"n{r // 2}" for r in range(8)], "group 0", 0.2, True, group_size=2)
    assert [(x["rank"], x["group"], x["node"]) for x in e.evidence] == [(1, 0, "n0"), (5, 2, "n2"), (7, 3, "n3")]
