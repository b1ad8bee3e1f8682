"""The chunk geometry: boxes from placements (against torch's own function), and the overlap
arithmetic of a load at another layout."""

import itertools

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from resilient_slurm.checkpoint.chunks import (
    Box,
    ChunkError,
    intersect,
    is_contiguous,
    shard_box,
    span,
    split_for_span,
    tiling_gap,
    uncovered,
)


def _torch(p):
    return {"R": lambda: Replicate(), "S": lambda: Shard(p[1]),
            "SS": lambda: _StridedShard(p[1], split_factor=p[2] if len(p) > 2 else 1)}[p[0]]()


CASES = [
    # (global shape, mesh shape, placements)
    ((10,), (4,), (("S", 0),)),                              # FSDP2: 3,3,3,1
    ((9, 5), (8,), (("S", 0),)),                             # more ranks than rows: 2,2,2,2,1,0,0,0
    ((6, 4), (3,), (("R",),)),
    ((8, 6), (2, 2), (("S", 0), ("S", 1))),                  # a 2-D cut
    ((8, 6), (2, 2), (("R",), ("S", 0))),                    # HSDP 2x2
    ((8, 6), (2, 2), (("SS", 0, 2), ("S", 0))),              # FSDP2 over colwise TP
    ((10, 6), (2, 2), (("SS", 0, 2), ("S", 0))),             # ... uneven: 3,2,3,2
    ((7, 5), (2, 3), (("SS", 0, 3), ("S", 0))),              # ... uneven with empties
    ((8, 6), (2, 2), (("S", 0), ("S", 1))),                  # FSDP2 over rowwise TP
    ((9, 7), (2, 3), (("S", 0), ("S", 1))),
    ((8, 6), (2, 2, 2), (("R",), ("SS", 0, 2), ("S", 0))),   # HSDP over TP, 3-D mesh
    ((12, 6), (2, 2, 2), (("R",), ("S", 0), ("S", 1))),
    ((16, 4), (2, 2, 2), (("SS", 0, 4), ("SS", 0, 2), ("S", 0))),
    ((5,), (2, 2), (("S", 0), ("S", 0))),                    # two plain cuts of one dim
    ((), (2,), (("R",),)),                                   # a replicated scalar
]


@pytest.mark.parametrize("shape, mesh, placements", CASES)
def test_boxes_match_torchs_compute_local_shape_and_global_offset(shape, mesh, placements):
    boxes = []
    for coord in itertools.product(*(range(n) for n in mesh)):
        box = shard_box(shape, mesh, coord, placements)
        want = _compute_local_shape_and_global_offset(shape, mesh, list(coord), [_torch(p) for p in placements])
        assert (box.lengths, box.offsets) == want, coord
        boxes.append(box)
    # Between them, the distinct boxes hold every element once (replicas repeat a box).
    assert tiling_gap(shape, list(set(boxes))) is None


def test_a_strided_shard_after_a_plain_one_leaves_no_box():
    # torch reports only the first offset of rows {1, 3}; one box cannot describe them.
    with pytest.raises(ChunkError, match="not one box"):
        shard_box((8,), (2, 2), (0, 1), (("S", 0), ("SS", 0, 2)))


@pytest.mark.parametrize("a, b, common", [
    (Box((0, 0), (4, 6)), Box((2, 3), (4, 6)), Box((2, 3), (2, 3))),
    (Box((0, 0), (4, 6)), Box((4, 0), (4, 6)), None),  # they touch, no element in common
    (Box((0,), (10,)), Box((3,), (2,)), Box((3,), (2,))),
    (Box((), ()), Box((), ()), Box((), ())),           # a scalar meets itself
])
def test_intersect(a, b, common):
    assert intersect(a, b) == common and intersect(b, a) == common


@pytest.mark.parametrize("shape, boxes, gap", [
    ((4, 4), [Box((0, 0), (4, 2)), Box((0, 2), (4, 2))], None),
    ((4, 4), [Box((0, 0), (4, 2))], "no chunk holds [0:4, 2:4]"),
    ((4, 4), [Box((0, 0), (2, 4)), Box((3, 0), (1, 4))], "no chunk holds [2:3, 0:4]"),
    ((4, 4), [Box((0, 0), (4, 3)), Box((0, 2), (4, 2))], "chunks [0:4, 0:3] and [0:4, 2:4] overlap"),
    ((4,), [Box((0,), (5,))], "chunk [0:5] lies outside the tensor's shape [4]"),
    ((), [], "no chunk holds []"),
    ((), [Box((), ())], None),
    ((0, 3), [], None),  # an empty tensor needs no chunk
])
def test_tiling_gap(shape, boxes, gap):
    assert tiling_gap(shape, boxes) == gap


def test_uncovered_names_the_largest_region_it_can_grow():
    target = Box((0, 0), (8, 6))
    have = [Box((0, 0), (8, 3)), Box((0, 3), (4, 3))]  # the bottom right quarter is missing
    assert uncovered(target, have) == Box((4, 3), (4, 3))
    assert uncovered(target, have + [Box((4, 3), (4, 3))]) is None


@pytest.mark.parametrize("sub, outer, contiguous, run", [
    (Box((2, 0), (3, 6)), (8, 6), True, (12, 30)),     # whole rows
    (Box((2, 1), (1, 4)), (8, 6), True, (13, 17)),     # part of one row
    (Box((2, 1), (2, 4)), (8, 6), False, (13, 23)),    # parts of two rows: the run between them too
    (Box((0, 0, 1), (2, 1, 3)), (2, 3, 4), False, (1, 16)),
    (Box((1, 2, 0), (1, 1, 4)), (2, 3, 4), True, (20, 24)),
    (Box((), ()), (), True, (0, 1)),
])
def test_contiguity_and_the_covering_run(sub, outer, contiguous, run):
    assert is_contiguous(sub, outer) is contiguous
    assert span(sub, outer) == run


def test_split_for_span_bounds_each_run_and_keeps_every_element():
    outer = (10, 8)
    sub = Box((1, 2), (7, 3))  # a column band: runs 8 elements apart
    pieces = split_for_span(sub, outer, max_elements=20)
    assert all(span(p, outer)[1] - span(p, outer)[0] <= 20 for p in pieces)
    cells = {(r, c) for p in pieces for r in range(p.offsets[0], p.ends[0]) for c in range(p.offsets[1], p.ends[1])}
    assert cells == {(r, c) for r in range(1, 8) for c in range(2, 5)}
    assert split_for_span(sub, outer, max_elements=1000) == [sub]


def test_strided_copy_from_a_run_takes_exactly_the_sub_box():
    # What the reader does with a run read into scratch: view it with the chunk's strides.
    chunk = torch.arange(48).view(6, 8)
    sub = Box((1, 2), (3, 4))
    first, stop = span(sub, (6, 8))
    run = chunk.reshape(-1)[first:stop].clone()
    got = run.as_strided(sub.lengths, chunk.stride())
    assert torch.equal(got, chunk[1:4, 2:6])
