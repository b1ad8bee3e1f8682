"""Buddy copies: after a save commits on a node-local hot tier, each rank sends the files it wrote
to its buddy on the next node (`nodes.Spread.buddy`), which keeps them under
`<its hot dir>/.buddy/<sender's node>/step_N/`. It runs on the save's own thread and process group,
after the commit, so training does not wait for it; a node that dies later leaves its part of the
checkpoint on its buddy, where a resume finds it (`spread.py`).

A copy is checked file by file against the manifest's CRC before it takes its name (`p2p.py`), so
an interrupted copy leaves no file that looks whole. Buddy copies of steps the node itself no longer
keeps (retention deleted them) are removed after each copy.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_slurm.checkpoint import layout, p2p
from resilient_slurm.checkpoint.nodes import BUDDY_DIR, Spread, Transfer, cut, rounds
from resilient_slurm.checkpoint.save import Collectives, SaveResult

CHUNK_BYTES = 64 << 20
"""Bytes per message."""
ROUND_BYTES = 256 << 20
"""Bytes in flight per round: the most a rank holds in memory for a copy."""


@dataclass(frozen=True)
class BuddyCopy:
    bytes: int
    """Bytes every rank received, together."""
    seconds: float
    problems: list[str]
    """Every rank's, so every rank knows whether the copy is whole."""


def buddy_root(root: Path, node: str) -> Path:
    """Where a node keeps the copies of `node`'s files."""
    return root / BUDDY_DIR / node


def plan(result: SaveResult, spread: Spread) -> list[Transfer]:
    """Every rank's files to its buddy."""
    assert result.manifest is not None
    out: list[Transfer] = []
    for src, rels in enumerate(result.by_rank):
        dst = spread.buddy(src)
        if dst is None:
            continue
        for rel in rels:
            out += cut(src, dst, rel, result.manifest.files[rel].nbytes, CHUNK_BYTES)
    return out


def replicate(root: Path, result: SaveResult, spread: Spread, comm: Collectives, group: Any) -> BuddyCopy:
    """Copy every rank's files of a just-committed checkpoint to its buddy (collective)."""
    assert result.manifest is not None
    start = time.perf_counter()
    transfers = plan(result, spread)
    step_dir = result.path.name
    rank = comm.rank
    problems = p2p.exchange(
        rounds(transfers, ROUND_BYTES), rank, group,
        source=lambda t: str(root / step_dir / t.rel),
        dest=lambda t: str(buddy_root(root, spread.nodes[t.src]) / step_dir / t.rel),
        crcs={rel: e.crc32 for rel, e in result.manifest.files.items()},
    )
    received = sum(t.length for t in transfers if t.dst == rank)
    gathered = comm.all_gather_object((problems, received))
    return BuddyCopy(sum(n for _, n in gathered), time.perf_counter() - start, [p for ps, _ in gathered for p in ps])


def prune(root: Path, keep: set[int]) -> list[Path]:
    """Remove buddy copies of steps not in `keep` (the steps this node still holds itself)."""
    removed: list[Path] = []
    base = root / BUDDY_DIR
    if not base.is_dir():
        return removed
    for node_dir in base.iterdir():
        for path in node_dir.iterdir() if node_dir.is_dir() else ():
            step = layout.parse_step_dir(path.name)
            if step is not None and step not in keep:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
