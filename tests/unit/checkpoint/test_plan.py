"""The save's plan, from what each rank holds: chunks, their holders, who writes each, the files."""

import pytest

from resilient_slurm.checkpoint.chunks import Box
from resilient_slurm.checkpoint.layout import TensorSpec
from resilient_slurm.checkpoint.plan import Entry, Holding, Mesh, PlanError, plan


def spec(name, *shape):
    return TensorSpec(name, tuple(shape), "F32", 4)


def sharded(name, shape, placements, mesh=0):
    return Entry(spec(name, *shape), mesh, placements)


def written(p, prefix="model"):
    """{rank: [(name, offsets, lengths), ...]} in file order, and the file names."""
    out = {}
    for f in p.files[prefix]:
        out.setdefault(f.rank, []).extend((c.name, c.box.offsets, c.box.lengths) for c in f.chunks)
    return out, [f.filename for f in p.files[prefix]]


MESH4 = Mesh((4,), (0, 1, 2, 3))
HSDP = Mesh((2, 2), (0, 1, 2, 3))      # (replicate, shard)
DP_TP = Mesh((2, 2), (0, 1, 2, 3))     # (dp, tp)


@pytest.mark.parametrize("holding, ranks, expect", [
    # FSDP2 over 4 ranks: each writes its own rows, the last share is short
    (Holding((("model", (sharded("w", (10, 2), (("S", 0),)),)),), (MESH4,)), (0, 1, 2, 3),
     {0: [("w", (0, 0), (3, 2))], 1: [("w", (3, 0), (3, 2))], 2: [("w", (6, 0), (3, 2))], 3: [("w", (9, 0), (1, 2))]}),
    # HSDP 2x2: each chunk has two holders (the replicas); the writing is spread over all four
    (Holding((("model", (sharded("a", (8, 2), (("R",), ("S", 0))), sharded("b", (8, 2), (("R",), ("S", 0))))),),
             (HSDP,)), (0, 1, 2, 3),
     {0: [("a", (0, 0), (4, 2))], 1: [("a", (4, 0), (4, 2))], 2: [("b", (0, 0), (4, 2))], 3: [("b", (4, 0), (4, 2))]}),
    # FSDP2 over rowwise TP: four distinct boxes, one holder each
    (Holding((("model", (sharded("o", (4, 4), (("S", 0), ("S", 1))),)),), (DP_TP,)), (0, 1, 2, 3),
     {0: [("o", (0, 0), (2, 2))], 1: [("o", (0, 2), (2, 2))], 2: [("o", (2, 0), (2, 2))], 3: [("o", (2, 2), (2, 2))]}),
    # plain tensors on every rank: written once each, spread by bytes (the largest first)
    (Holding((("model", (Entry(spec("big", 8)), Entry(spec("s1", 1)), Entry(spec("s2", 1)), Entry(spec("s3", 1)))),)),
     (0, 1, 2, 3), {0: [("big", (0,), (8,))], 1: [("s1", (0,), (1,))], 2: [("s2", (0,), (1,))], 3: [("s3", (0,), (1,))]}),
])
def test_each_distinct_chunk_is_written_once_by_one_of_its_holders(holding, ranks, expect):
    got, _ = written(plan([(holding, ranks)], 1 << 30))
    assert got == expect


def test_pipeline_stages_hold_different_tensors_and_each_writes_its_own():
    stage0 = Holding((("model", (sharded("layers.0.w", (4, 2), (("S", 0),)),)),), (Mesh((2,), (0, 1)),))
    stage1 = Holding((("model", (sharded("layers.1.w", (4, 2), (("S", 0),)), Entry(spec("norm", 2)))),),
                     (Mesh((2,), (2, 3)),))
    p = plan([(stage0, (0, 1)), (stage1, (2, 3))], 1 << 30)
    got, names = written(p)
    assert got == {0: [("layers.0.w", (0, 0), (2, 2))], 1: [("layers.0.w", (2, 0), (2, 2))],
                   2: [("layers.1.w", (0, 0), (2, 2)), ("norm", (0,), (2,))], 3: [("layers.1.w", (2, 0), (2, 2))]}
    assert names == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert [s.name for s in p.specs["model"]] == ["layers.0.w", "layers.1.w", "norm"]


def test_a_tensor_two_stages_hold_alike_is_written_once():
    tied = Entry(spec("shared", 6))
    p = plan([(Holding((("model", (tied,)),)), (0,)), (Holding((("model", (tied, Entry(spec("x", 1)))),)), (1,))],
             1 << 30)
    got, _ = written(p)
    assert sorted(n for chunks in got.values() for n, _, _ in chunks) == ["shared", "x"]


def test_files_are_cut_at_max_shard_bytes_in_each_ranks_state_order():
    h = Holding((("model", tuple(Entry(spec(n, 4)) for n in "abcd")),))
    p = plan([(h, (0,))], max_shard_bytes=32)
    assert [(f.filename, [c.name for c in f.chunks]) for f in p.files["model"]] == [
        ("model-00001-of-00002.safetensors", ["a", "b"]), ("model-00002-of-00002.safetensors", ["c", "d"])]
    assert [f.filename for f in plan([(h, (0,))], 1 << 30).files["model"]] == ["model.safetensors"]


def test_the_plan_is_the_same_whoever_computes_it():
    h = Holding((("model", (sharded("a", (8, 2), (("R",), ("S", 0))), Entry(spec("b", 3)))),), (HSDP,))
    assert plan([(h, (0, 1, 2, 3))], 1 << 30).digest == plan([(h, (0, 1, 2, 3))], 1 << 30).digest


def test_optimizer_groups_of_every_stage_are_kept_with_a_rank_that_has_them():
    s0 = Holding((("model", (Entry(spec("a", 1)),)),), groups=(("a",),), optimizer="AdamW")
    s1 = Holding((("model", (Entry(spec("b", 1)),)),), groups=(("b",), ()), optimizer="AdamW")
    p = plan([(s0, (0, 1)), (s1, (2, 3))], 1 << 30)
    assert p.groups == ((("a",), 0, 0), (("b",), 2, 0), ((), 2, 1)) and p.optimizer == "AdamW"


@pytest.mark.parametrize("classes, message", [
    # a stage's mesh names ranks 0 and 1, but rank 1 describes other tensors: half of "w" has no holder
    ([(Holding((("model", (sharded("w", (10,), (("S", 0),)),)),), (Mesh((2,), (0, 1)),)), (0,)),
      (Holding((("model", (Entry(spec("v", 1)),)),)), (1,))],
     "model tensor 'w' [10]: no chunk holds [5:10] among what the ranks hold"),
    ([(Holding((("model", (Entry(spec("w", 4)),)),)), (0,)), (Holding((("model", (Entry(spec("w", 5)),)),)), (1,))],
     "model tensor 'w' is F32[5] on rank 1 but F32[4] on another"),
    ([(Holding((("model", (sharded("w", (4,), (("S", 0),)),)),), (Mesh((2,), (0, 1)),)), (0, 2))],
     "rank 2 holds it on a mesh of ranks [0, 1], which it is not part of"),
    ([(Holding((("model", (sharded("w", (8,), (("S", 0), ("SS", 0, 2))),)),), (Mesh((2, 2), (0, 1, 2, 3)),)),
       (0, 1, 2, 3))], "not one box"),
])
def test_states_that_do_not_make_a_checkpoint_are_refused_naming_the_tensor(classes, message):
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan(classes, 1 << 30)


def test_box_dataclass_describes_ranges():
    assert Box((4, 0), (4, 16)).describe() == "[4:8, 0:16]"
