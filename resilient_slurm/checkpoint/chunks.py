"""N-dimensional chunks of a tensor: which box of a global tensor a rank holds under a DTensor's
placements, and the overlap arithmetic a load at another layout needs. Pure.

A box is a global offset and a length per dimension (a scalar's box has no dimensions and holds one
element). A placement is described by plain tuples, so every rank can work out the box of any
other rank from the mesh's shape and that rank's coordinate, without asking it:

    ("R",)            Replicate: every coordinate of the mesh dimension holds the whole extent
    ("S", d)          Shard(d): torch.chunk's cut of dim d, ceil(n / k) long, the last ones shorter
                      or empty
    ("SS", d, f)      _StridedShard(d, split_factor=f): dim d cut into f pieces first, each piece
                      cut into k and this coordinate's part of every piece taken (FSDP2 over a
                      tensor-parallel shard of the same dim)

Placements apply from mesh dimension 0 rightwards, each to the indices the earlier ones left, as
torch's `compute_local_shape_and_global_offset` does. When the indices a rank ends with along a
dimension are not one run (a strided shard applied after a plain one), no box describes them and
`shard_box` refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

Placement = tuple
"""("R",), ("S", dim) or ("SS", dim, split_factor)."""


class ChunkError(ValueError):
    """A placement this format cannot describe as one box per rank."""


@dataclass(frozen=True)
class Box:
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def volume(self) -> int:
        return prod(self.lengths)

    @property
    def ends(self) -> tuple[int, ...]:
        return tuple(o + n for o, n in zip(self.offsets, self.lengths))

    def relative_to(self, outer: Box) -> Box:
        return Box(tuple(a - b for a, b in zip(self.offsets, outer.offsets)), self.lengths)

    def describe(self) -> str:
        """`[4:8, 0:16]`: the index ranges, as a slice of the global tensor would name them."""
        return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(self.offsets, self.lengths)) + "]"


def whole(shape: tuple[int, ...]) -> Box:
    return Box((0,) * len(shape), tuple(shape))


def shard_box(shape: tuple[int, ...], mesh_shape: tuple[int, ...], coord: tuple[int, ...],
              placements: tuple[Placement, ...]) -> Box:
    """The box the rank at `coord` of a mesh holds of a tensor of global `shape`. An empty share
    along a dimension has length 0 at offset `shape[d]`, as torch reports it."""
    runs: list[list[tuple[int, int]]] = [[(0, n)] for n in shape]
    for mesh_dim, p in enumerate(placements):
        if p[0] == "R":
            continue
        if p[0] not in ("S", "SS") or not 0 <= p[1] < len(shape):
            raise ChunkError(f"placement {p} on mesh dimension {mesh_dim} of a {len(shape)}-d tensor")
        d, k, c = p[1], mesh_shape[mesh_dim], coord[mesh_dim]
        n = sum(b - a for a, b in runs[d])
        if p[0] == "S":
            picked = [_chunk(0, n, k, c)]
        else:
            size = -(-n // p[2]) if n else 0
            picked = []
            for piece in range(p[2]):
                start, stop = min(piece * size, n), min((piece + 1) * size, n)
                a, b = _chunk(start, stop, k, c)
                picked.append((a, b))
        runs[d] = _select(runs[d], picked)
    offsets, lengths = [], []
    for d, r in enumerate(runs):
        r = [(a, b) for a, b in r if b > a]
        if not r:
            offsets.append(shape[d])
            lengths.append(0)
        elif len(r) > 1:
            raise ChunkError(f"placements {placements} leave rank {coord} of mesh {mesh_shape} indices "
                             f"{r[0][0]}..{r[0][1]} and {r[1][0]}..{r[1][1]} of dim {d}: not one box")
        else:
            offsets.append(r[0][0])
            lengths.append(r[0][1] - r[0][0])
    return Box(tuple(offsets), tuple(lengths))


def _chunk(start: int, stop: int, k: int, c: int) -> tuple[int, int]:
    """Positions of chunk `c` when [start, stop) is cut in `k` as torch.chunk cuts it."""
    n = stop - start
    size = -(-n // k) if n else 0
    return start + min(c * size, n), start + min((c + 1) * size, n)


def _select(runs: list[tuple[int, int]], positions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The global index runs at `positions` (ranges of places in the concatenation of `runs`),
    adjacent runs merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in positions:
        base = 0
        for a, b in runs:
            s, e = max(lo, base), min(hi, base + b - a)
            if s < e:
                ga, gb = a + s - base, a + e - base
                if out and out[-1][1] == ga:
                    out[-1] = (out[-1][0], gb)
                else:
                    out.append((ga, gb))
            base += b - a
    return out


def intersect(a: Box, b: Box) -> Box | None:
    """The common part of two boxes of one tensor, or None; a scalar's box meets itself."""
    offsets = tuple(max(x, y) for x, y in zip(a.offsets, b.offsets))
    ends = tuple(min(x, y) for x, y in zip(a.ends, b.ends))
    if any(e <= o for o, e in zip(offsets, ends)):
        return None
    return Box(offsets, tuple(e - o for o, e in zip(offsets, ends)))


def tiling_gap(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    """Why `boxes` do not cover a tensor of `shape` exactly once (an overlap, or the first region
    no box covers), or None when they do. Empty boxes (a rank's empty share) hold nothing."""
    inside = whole(shape)
    for b in boxes:
        if len(b.offsets) != len(shape) or (b.volume and intersect(b, inside) != b):
            return f"chunk {b.describe()} lies outside the tensor's shape {list(shape)}"
    ordered = sorted((b for b in boxes if b.volume), key=lambda b: b.offsets)
    for i, b in enumerate(ordered):
        for other in ordered[i + 1:]:
            if shape and other.offsets[0] >= b.ends[0]:
                break  # sorted by dim 0: no later box can overlap this one
            if intersect(b, other) is not None:
                return f"chunks {b.describe()} and {other.describe()} overlap"
    if sum(b.volume for b in ordered) == prod(shape):
        return None
    hole = uncovered(whole(shape), ordered)
    return f"no chunk holds {hole.describe() if hole else 'part of it'}"


def uncovered(target: Box, boxes: list[Box]) -> Box | None:
    """A region of `target` that no box covers, grown as far as it stays uncovered (to name it in
    an error), or None when the boxes cover all of it."""
    if not target.lengths:
        return None if any(b.offsets == () for b in boxes) else target
    cuts = []
    for d in range(len(target.offsets)):
        points = {target.offsets[d], target.ends[d]}
        for b in boxes:
            points |= {p for p in (b.offsets[d], b.ends[d]) if target.offsets[d] < p < target.ends[d]}
        cuts.append(sorted(points))

    def covered(cell: tuple[int, ...]) -> bool:
        probe = Box(tuple(cuts[d][i] for d, i in enumerate(cell)), (1,) * len(cell))
        return any(intersect(probe, b) for b in boxes)

    first = _first_cell(cuts, covered)
    if first is None:
        return None
    lo, hi = list(first), [i + 1 for i in first]
    for d in range(len(cuts)):
        while hi[d] < len(cuts[d]) - 1 and all(not covered(c) for c in _cells(lo, hi, d, hi[d])):
            hi[d] += 1
    return Box(tuple(cuts[d][lo[d]] for d in range(len(cuts))),
               tuple(cuts[d][hi[d]] - cuts[d][lo[d]] for d in range(len(cuts))))


def _first_cell(cuts: list[list[int]], covered: Callable[[tuple[int, ...]], bool]) -> tuple[int, ...] | None:
    index = [0] * len(cuts)
    while True:
        if not covered(tuple(index)):
            return tuple(index)
        d = len(cuts) - 1
        while d >= 0:
            index[d] += 1
            if index[d] < len(cuts[d]) - 1:
                break
            index[d] = 0
            d -= 1
        if d < 0:
            return None


def _cells(lo: list[int], hi: list[int], d: int, at: int) -> list[tuple[int, ...]]:
    """The cells of the slab [lo, hi) with dimension `d` fixed at `at`."""
    out: list[tuple[int, ...]] = [()]
    for k in range(len(lo)):
        values = [at] if k == d else range(lo[k], hi[k])
        out = [c + (v,) for c in out for v in values]
    return out


def strides(lengths: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a box of `lengths`."""
    out, step = [], 1
    for n in reversed(lengths):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def is_contiguous(sub: Box, outer: tuple[int, ...]) -> bool:
    """Whether box `sub` (offsets relative to a row-major box of lengths `outer`) is one run of
    consecutive elements there: full in every dimension after some k, one index before it."""
    k = next((d for d in range(len(outer)) if sub.lengths[d] != 1), len(outer))
    return all(sub.lengths[d] == outer[d] for d in range(k + 1, len(outer)))


def span(sub: Box, outer: tuple[int, ...]) -> tuple[int, int]:
    """[first, last + 1) element of `sub` within a row-major box of lengths `outer`: the smallest
    contiguous run that holds all of it."""
    st = strides(outer)
    first = sum(o * s for o, s in zip(sub.offsets, st))
    last = sum((o + n - 1) * s for o, n, s in zip(sub.offsets, sub.lengths, st))
    return first, last + 1


def split_for_span(sub: Box, outer: tuple[int, ...], max_elements: int) -> list[Box]:
    """`sub` cut along its outermost dimensions into pieces whose `span` is at most
    `max_elements` (or a single index of every dimension but the last, if even that is larger)."""
    first, stop = span(sub, outer)
    d = next((d for d in range(len(outer)) if sub.lengths[d] > 1), None)
    if stop - first <= max_elements or d is None or d == len(outer) - 1:
        return [sub]
    step = strides(outer)[d]
    inner = Box(sub.offsets[d + 1:], sub.lengths[d + 1:])
    inner_span = span(inner, outer[d + 1:])
    per = max(1, (max_elements - (inner_span[1] - inner_span[0])) // step + 1)
    out: list[Box] = []
    for start in range(0, sub.lengths[d], per):
        n = min(per, sub.lengths[d] - start)
        piece = Box(sub.offsets[:d] + (sub.offsets[d] + start,) + sub.offsets[d + 1:],
                    sub.lengths[:d] + (n,) + sub.lengths[d + 1:])
        out += split_for_span(piece, outer, max_elements) if n == 1 else [piece]
    return out
