import pytest

from resilient_slurm.checkpoint.layout import (
    index_for,
    parse_step_dir,
    plan_shards,
    step_dir_name,
)


@pytest.mark.parametrize(
    "name, step",
    [("step_00000100", 100), ("step_123456789", 123456789), ("step_100", None), (".tmp.step_00000100", None),
     ("step_0000010x", None), ("latest", None)],
)
def test_parse_step_dir(name, step):
    assert parse_step_dir(name) == step


def test_step_dir_round_trip():
    assert parse_step_dir(step_dir_name(42)) == 42


SIZES = [("a", 100), ("b", 100), ("c", 100), ("d", 100)]


@pytest.mark.parametrize(
    "sizes, world, max_bytes, expected",
    [
        # one rank, fits: the plain HF name
        (SIZES, 1, 10_000, [("model.safetensors", 0, ("a", "b", "c", "d"))]),
        # one rank, cut by size into numbered shards, order kept
        (SIZES, 1, 200, [("model-00001-of-00002.safetensors", 0, ("a", "b")),
                         ("model-00002-of-00002.safetensors", 0, ("c", "d"))]),
        # two ranks: a contiguous half each
        (SIZES, 2, 10_000, [("model-00001-of-00002.safetensors", 0, ("a", "b")),
                            ("model-00002-of-00002.safetensors", 1, ("c", "d"))]),
        # a tensor larger than the limit still gets a file of its own
        ([("big", 1000), ("s", 1)], 1, 100, [("model-00001-of-00002.safetensors", 0, ("big",)),
                                              ("model-00002-of-00002.safetensors", 0, ("s",))]),
        # more ranks than tensors: some ranks write nothing
        ([("a", 10)], 3, 1000, [("model.safetensors", 1, ("a",))]),
        # unbalanced sizes: balanced by bytes, not by count
        ([("a", 10), ("b", 10), ("c", 300)], 2, 10_000, [("model-00001-of-00002.safetensors", 0, ("a", "b")),
                                                         ("model-00002-of-00002.safetensors", 1, ("c",))]),
    ],
)
def test_plan_shards(sizes, world, max_bytes, expected):
    plan = plan_shards("model", sizes, world, max_bytes)
    assert [(s.filename, s.rank, s.names) for s in plan] == expected


def test_every_tensor_planned_exactly_once():
    sizes = [(f"t{i}", (i * 37) % 101 + 1) for i in range(50)]
    for world in (1, 2, 3, 8):
        plan = plan_shards("optimizer", sizes, world, 300)
        names = [n for s in plan for n in s.names]
        assert sorted(names) == sorted(n for n, _ in sizes)
        assert len(names) == len(set(names))


def test_index_only_for_several_files():
    one = plan_shards("model", SIZES, 1, 10_000)
    assert index_for(one, dict(SIZES)) is None
    two = plan_shards("model", SIZES, 2, 10_000)
    index = index_for(two, dict(SIZES))
    assert index["metadata"]["total_size"] == 400
    assert index["weight_map"] == {"a": two[0].filename, "b": two[0].filename,
                                   "c": two[1].filename, "d": two[1].filename}
