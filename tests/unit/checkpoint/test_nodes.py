"""A node-local hot tier's plan: leaders, buddies, and who sends which bytes to whom; and which
spread checkpoint a resume can use."""

import pytest

from resilient_slurm.checkpoint.manifest import FileEntry, Manifest
from resilient_slurm.checkpoint.nodes import Spread, Transfer, cut, expand, node_local, plan_fetch, rounds
from resilient_slurm.checkpoint.spread import Holding, candidates, holders


def test_node_local_dirs():
    assert node_local("/nvme/%n/ckpt") and not node_local("/shared/ckpt")
    assert expand("/nvme/%n/ckpt", "gpu07") == "/nvme/gpu07/ckpt"


def test_leaders_and_buddies():
    s = Spread(("a", "a", "b", "b", "c", "c"))
    assert s.order == ("a", "b", "c") and s.leaders == (0, 2, 4)
    assert s.is_leader(2) and not s.is_leader(3)
    # the same local index on the next node, the last node's buddy the first
    assert [s.buddy(r) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    # ranks that need not be contiguous or even per node
    odd = Spread(("a", "b", "a", "b", "b"))
    assert odd.ranks_on("b") == (1, 3, 4) and odd.leader("b") == 1
    assert [odd.buddy(r) for r in range(5)] == [1, 0, 3, 2, 2]
    assert Spread(("a", "a")).buddy(1) is None  # one node: nowhere to copy to


def test_files_are_cut_into_messages_and_rounds_bound_what_is_in_flight():
    assert cut(0, 1, "f", 10, 4) == [Transfer(0, 1, "f", 0, 4, 10), Transfer(0, 1, "f", 4, 4, 10),
                                      Transfer(0, 1, "f", 8, 2, 10)]
    assert cut(0, 1, "empty", 0, 4) == [Transfer(0, 1, "empty", 0, 0, 0)]
    plan = cut(0, 1, "f", 10, 4) + cut(2, 1, "g", 3, 4)
    assert [[t.length for t in r] for r in rounds(plan, 8)] == [[4, 4], [2, 3]]
    assert [[t.length for t in r] for r in rounds(plan, 1)] == [[4], [4], [2], [3]]  # one larger message alone


def test_each_wanted_file_comes_from_the_least_busy_holder():
    sizes = {"x": 10, "y": 10, "z": 1}
    plan = plan_fetch({"x": [0, 2], "y": [0, 2], "z": [2]}, {4: ["y", "x", "z"], 6: ["x"]}, sizes, chunk=100)
    assert [(t.src, t.dst, t.rel) for t in plan] == [(0, 4, "x"), (2, 4, "y"), (2, 4, "z"), (0, 6, "x")]
    with pytest.raises(KeyError):
        plan_fetch({}, {4: ["lost"]}, {"lost": 1}, chunk=100)


def manifest(step, **files):
    return Manifest(step, 2, {rel: FileEntry(size, 0) for rel, size in files.items()}, "t").to_json()


def test_a_resume_uses_the_newest_step_whose_every_file_a_node_holds():
    m2, m1 = manifest(2, a=5, b=5), manifest(1, a=4, b=4)
    held = {
        0: Holding(manifests={2: [m2], 1: [m1]}, own={2: {"a": 5}, 1: {"a": 4}}, buddy={1: {"b": ("n2", 4)}}),
        2: Holding(manifests={2: [m2]}, own={2: {"b": 3}}),  # a torn copy of b: not held at its size
    }
    assert [(s, sorted(m.files)) for s, m in candidates(held, None)] == [(1, ["a", "b"])]
    assert holders(held, 1, "b", 4) == [0] and holders(held, 2, "b", 5) == []
    held[2].own[2]["b"] = 5
    assert [s for s, _ in candidates(held, None)] == [2, 1] and [s for s, _ in candidates(held, 2)] == [1]


def test_a_stripped_manifest_is_the_fallback_when_the_optimizer_files_are_gone():
    full, stripped = manifest(3, model=5, optimizer=5), manifest(3, model=5)
    held = {0: Holding(manifests={3: [full]}, own={3: {"model": 5}}), 1: Holding(manifests={3: [stripped]})}
    assert [sorted(m.files) for _, m in candidates(held, None)] == [["model"]]
    held[1].own[3] = {"optimizer": 5}
    assert [sorted(m.files) for _, m in candidates(held, None)] == [["model", "optimizer"], ["model"]]
