import pytest

from resilient_slurm.slurm import placement
from resilient_slurm.slurm.placement import Allocation, Move, after_failure, grow_back, returned, seen


def alloc(in_use="abcd", spares="xy", target=4, min_nodes=None, failed=""):
    return Allocation(tuple(in_use), tuple(spares), target, target if min_nodes is None else min_nodes,
                      frozenset(failed))


@pytest.mark.parametrize(
    "before, failed, out, move, in_use, spares, exclude",
    [
        # a crash with no node at fault: the same nodes again, no spare used
        (alloc(), "", "", Move.IN_PLACE, "abcd", "xy", ""),
        # a failed node is replaced by the first spare; the rest keep their order
        (alloc(), "b", "", Move.SPARE, "acdx", "y", ""),
        # a node out for a GPU reset is replaced the same way
        (alloc(), "", "c", Move.SPARE, "abdx", "y", ""),
        # two at once take both spares
        (alloc(), "ab", "", Move.SPARE, "cdxy", "", ""),
        # a spare that failed earlier in this allocation is never chosen
        (alloc(spares="xy", failed="x"), "a", "", Move.SPARE, "bcdy", "", ""),
        # no spare, elastic off: requeue without every node that failed here
        (alloc(spares="", failed="z"), "a", "", Move.REQUEUE, "bcd", "", "az"),
        # no spare, elastic on and above the floor: shrink
        (alloc(spares="", min_nodes=3), "a", "", Move.SHRINK, "bcd", "", ""),
        # one spare for two lost nodes: shrink onto survivors plus the spare
        (alloc(spares="x", min_nodes=3), "ab", "", Move.SHRINK, "cdx", "", ""),
        # below the floor even with every spare: requeue
        (alloc(spares="x", min_nodes=4), "ab", "", Move.REQUEUE, "cd", "x", "ab"),
        (alloc(spares="", min_nodes=3), "ab", "", Move.REQUEUE, "cd", "", "ab"),
        # a node out for repair is not excluded at a requeue: only failed ones are
        (alloc(spares="", failed=""), "a", "b", Move.REQUEUE, "cd", "", "a"),
    ],
)
def test_after_failure(before, failed, out, move, in_use, spares, exclude):
    p = after_failure(before, tuple(failed), tuple(out))
    assert p.move is move, p.reason
    assert p.allocation.in_use == tuple(in_use)
    assert p.allocation.spares == tuple(spares)
    assert p.exclude == tuple(exclude)
    assert set(failed) <= p.allocation.failed
    assert not set(p.allocation.in_use) & p.allocation.failed


def test_a_node_back_from_repair_is_a_spare_but_a_failed_one_never_comes_back():
    a = after_failure(alloc(spares=""), (), ("c",)).allocation
    assert returned(a, "c").spares == ("c",)
    b = after_failure(alloc(spares="x"), ("c",)).allocation
    assert returned(b, "c") == b


@pytest.mark.parametrize(
    "in_use, spares, target, restart_s, mtbf_s, grows, new_in_use",
    [
        ("abc", "x", 4, 60.0, 3600.0, True, "abcx"),  # 1 node x 3600 s regained > 3 nodes x 60 s
        ("abc", "x", 4, 60.0, 100.0, False, "abc"),  # the next failure comes too soon to pay
        ("abc", "", 4, 60.0, 3600.0, False, "abc"),  # nothing to grow onto
        ("abcd", "x", 4, 60.0, 3600.0, False, "abcd"),  # not shrunk
        ("ab", "xyz", 4, 1.0, 3600.0, True, "abxy"),  # only up to the target; z stays a spare
    ],
)
def test_grow_back(in_use, spares, target, restart_s, mtbf_s, grows, new_in_use):
    a = Allocation(tuple(in_use), tuple(spares), target, 1)
    p = grow_back(a, restart_s, mtbf_s)
    assert (p is not None) == grows
    if p is not None:
        assert p.allocation.in_use == tuple(new_in_use)
        assert set(p.allocation.spares) == set(spares) - set(new_in_use)


@pytest.mark.parametrize(
    "failed, taken_out, usable, spares, still_failed, now_out",
    [
        # a failed node seen drained (or on the exclude list) is taken out of service
        ("c", "", {"c": False}, "", "c", "c"),
        # taken out, then resumed and off the exclude list: returned to service, a spare again
        ("c", "c", {"c": True}, "c", "", ""),
        # still out: it stays failed
        ("c", "c", {"c": False}, "", "c", "c"),
        # never seen out of service (its task vanished; nobody drained it): usable-looking, still failed
        ("c", "", {"c": True}, "", "c", ""),
        # unknown (scontrol did not answer): nothing changes
        ("c", "c", {}, "", "c", "c"),
        # each node on its own
        ("cd", "cd", {"c": True, "d": False}, "c", "d", "d"),
    ],
)
def test_a_failed_node_comes_back_only_once_returned_to_service(failed, taken_out, usable, spares, still_failed,
                                                               now_out):
    a = Allocation(("a", "b"), (), 4, 1, frozenset(failed), frozenset(taken_out))
    b = seen(a, usable)
    assert (b.spares, b.failed, b.taken_out) == (tuple(spares), frozenset(still_failed), frozenset(now_out))
    assert b.in_use == a.in_use


def test_a_shrunk_run_grows_back_onto_a_node_returned_to_service_and_it_can_fail_again():
    shrunk = after_failure(alloc(in_use="ab", spares="", target=2, min_nodes=1), ("b",)).allocation
    assert shrunk.in_use == ("a",) and grow_back(shrunk, 10.0, 3600.0) is None  # b failed: never chosen automatically
    drained = seen(shrunk, {"b": False})
    grow = grow_back(seen(drained, {"b": True}), 10.0, 3600.0)
    assert grow is not None and grow.added == ("b",) and grow.allocation.in_use == ("a", "b")
    assert not grow.allocation.failed and not grow.allocation.taken_out and not grow.allocation.spares
    again = after_failure(grow.allocation, ("b",))
    assert again.move is Move.SHRINK and again.allocation.failed == {"b"} and not again.allocation.taken_out


def test_bad_floor_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="min_nodes=5 must be between 1 and the target of 4"):
        Allocation(("a",), (), 4, 5)


@pytest.mark.parametrize("group, lost, spares, nodes, in_use, left", [
    # the group's lost node swapped for the spare where it stood; the other group untouched
    (("n2",), ["n2"], ("n3",), ("n3",), ("n1", "n3"), ()),
    (("n3", "n4"), ["n4"], ("n5", "n6"), ("n3", "n5"), ("n1", "n2", "n3", "n5"), ("n6",)),
    # nothing lost: the same nodes (the group starts anew in place)
    (("n2",), [], ("n3",), ("n2",), ("n1", "n2"), ("n3",)),
    # a lost node of another group is not this group's to replace
    (("n2",), ["n1"], ("n3",), ("n2",), ("n1", "n2"), ("n3",)),
])
def test_a_replica_group_is_replaced_on_spares_in_place(group, lost, spares, nodes, in_use, left):
    alloc = Allocation(("n1", "n2") if len(group) == 1 else ("n1", "n2", "n3", "n4"), spares, 2, 2)
    got = placement.replace_group(alloc, group, lost)
    assert got is not None
    after, new = got
    assert (new, after.in_use, after.spares) == (nodes, in_use, left)
    assert after.failed == frozenset(n for n in lost if n in group)


def test_a_replica_group_without_enough_spares_stays_out():
    alloc = Allocation(("n1", "n2"), (), 2, 2)
    assert placement.replace_group(alloc, ("n2",), ["n2"]) is None
    assert placement.replace_group(Allocation(("n1", "n2"), ("n3",), 2, 2, failed=frozenset({"n3"})), ("n2",),
                                   ["n2"]) is None
