"""The block plan: which source each global sequence of a data phase comes from.

A block of BLOCK positions holds c_s sequences of source s, c_s the weight's share of BLOCK rounded
by largest remainder (so the c_s sum to BLOCK and each is within one sequence of its exact share).
Within the block the sources are interleaved smoothly: the j-th sequence of source s sits at its
ideal time (j + 1/2) / c_s, ties broken by source order. So the count of any source in the first n
positions stays within about one sequence of n * c_s / BLOCK, and in any n consecutive positions
(across blocks, which repeat) within two: over 1,000 global batches of even one sequence that is
0.2%, far inside 1%. Megatron's blend greedily draws from the source furthest behind its weight,
which gives the same bound but needs the whole index precomputed; this plan is a function of the
position, computed in O(1) for any step of any run length.

Every sequence is seq_len + 1 tokens, so shares of sequences are shares of trained tokens.
The source-local counter of a position (the how-many-th sequence of that source it is) is what the
source's own order (order.py) turns into a window of its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from resilient_slurm.data.tokens.errors import TokenDataError

BLOCK = 1 << 16


class BlockPlan:
    def __init__(self, names: Sequence[str], weights: Sequence[float]) -> None:
        total = float(sum(weights))
        exact = np.asarray(weights, dtype=np.float64) / total * BLOCK
        counts = np.floor(exact).astype(np.int64)
        # Largest remainder: the sequences left over go to the largest fractional parts, first source first.
        order = sorted(range(len(counts)), key=lambda s: (-(exact[s] - counts[s]), s))
        for s in order[: BLOCK - int(counts.sum())]:
            counts[s] += 1
        for name, weight, c in zip(names, weights, counts):
            if c == 0:
                raise TokenDataError(f"data.sources[{name}].weight: {weight} is below 1/{BLOCK} of the total weight "
                                     f"{total:g}, the plan's resolution; raise it or drop the source")
        self.names = list(names)
        self.shares = np.asarray(weights, dtype=np.float64) / total
        self.counts = counts
        keys = np.concatenate([(np.arange(c) + 0.5) / c for c in counts])
        owners = np.repeat(np.arange(len(counts)), counts)
        slots = np.lexsort((owners, keys))
        self.slot_source = owners[slots].astype(np.int32)
        """The source of each position of a block."""
        self.slot_rank = np.empty(BLOCK, np.int64)
        """How many sequences of its source come before it in the block."""
        for s in range(len(counts)):
            mine = self.slot_source == s
            self.slot_rank[mine] = np.arange(int(counts[s]))

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source index and source-local counter of each phase-relative position."""
        block, offset = np.divmod(np.asarray(positions, dtype=np.int64), BLOCK)
        source = self.slot_source[offset]
        return source, block * self.counts[source] + self.slot_rank[offset]

    def consumed(self, count: int) -> np.ndarray:
        """Sequences of each source among the first `count` positions."""
        block, offset = divmod(int(count), BLOCK)
        return block * self.counts + np.bincount(self.slot_source[:offset], minlength=len(self.counts))
