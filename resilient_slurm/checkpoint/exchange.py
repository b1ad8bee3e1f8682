"""The ranks agree on a save's plan: what each holds, exchanged once per layout, and the plan cached
on the layout's signature.

Ranks may hold different tensors (pipeline stages hold different layers), so no rank can derive
the plan from its own state alone. Each describes what it holds (`plan.Holding`) and hashes it;
the save's first collective gathers every rank's hash (with its optimizer's hyper-parameters,
which change every step and go into optimizer.json). When the hashes are the ones the cached plan
was made from, that plan stands: a steady run pays nothing beyond that one small all-gather, which
is also the barrier the save needs after its directory is made. Otherwise the lowest rank of each
distinct description sends it (the ranks of a stage describe the same thing, so a run sends as many
descriptions as it has stages), and every rank derives the same plan (`plan.plan`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.collectives import Collectives
from resilient_slurm.checkpoint.plan import Entry, Holding, Mesh, Plan, PlanError, plan
from resilient_slurm.checkpoint.state import Held, Snapshot, optimizer_meta

_CACHE: dict[str, tuple[Plan, dict[str, bytes]]] = {}
"""Plans by a digest of every rank's holding signature (and the file size limit)."""
_CACHED_PLANS = 4
"""Layouts whose plans are kept: the disk saves' and the memory tier's, and a weights-only one."""


class PlanFailed(RuntimeError):
    """The ranks' states do not make a checkpoint; the same message on every rank."""


@dataclass(frozen=True)
class Agreed:
    plan: Plan
    optimizer_json: dict[str, Any] | None
    """optimizer.json, from every rank's param groups (None without an optimizer)."""
    exchanged: bool
    """The descriptions were exchanged (a new layout), not taken from the cache."""
    indexes: dict[str, bytes]
    """Each prefix's shards index as rank 0 writes it: made once per layout (at 4096 tensors its
    JSON took a fifth of a 1.7 GB save's time when made at every save)."""


def holding(snap: Snapshot) -> Holding:
    meshes: dict[Mesh, int] = {}

    def entries(named: dict[str, Held]) -> tuple[Entry, ...]:
        out = []
        for h in named.values():
            if h.placed is None:
                out.append(Entry(h.spec))
            else:
                mesh, placements = h.placed
                out.append(Entry(h.spec, meshes.setdefault(mesh, len(meshes)), placements))
        return tuple(out)

    tensors = tuple((prefix, entries(named)) for prefix, named in ((layout.MODEL, snap.model),
                                                                  (layout.OPTIMIZER, snap.optimizer)) if named)
    return Holding(tensors, tuple(meshes), tuple(g.params for g in snap.groups), snap.optimizer_type)


def signature(h: Holding) -> str:
    return hashlib.sha256(repr(h).encode()).hexdigest()


def agree(snap: Snapshot, comm: Collectives, max_shard_bytes: int) -> Agreed:
    """The plan every rank uses for this save (collective: one all-gather, two on a new layout).
    PlanFailed, on every rank alike, when the states do not make a checkpoint."""
    mine = holding(snap)
    sig = signature(mine)
    # Whether the plan is cached must be agreed: a rank restarted in its process (or a replacement)
    # has an empty cache while its peers keep theirs, and one rank alone exchanging would pair its
    # all-gather with another collective of theirs.
    gathered = comm.all_gather_object((sig, [g.hyper for g in snap.groups], frozenset(_CACHE)))
    sigs = tuple(s for s, _, _ in gathered)
    key = hashlib.sha256(repr((sigs, max_shard_bytes)).encode()).hexdigest()
    exchanged = not all(key in cached for _, _, cached in gathered)
    if exchanged:
        first = {s: r for r, s in reversed(list(enumerate(sigs)))}
        described = comm.all_gather_object(mine if first[sig] == comm.rank else None)
        classes = [(described[r], tuple(q for q, t in enumerate(sigs) if t == s)) for s, r in sorted(first.items(),
                                                                                                   key=lambda i: i[1])]
        try:
            made = plan(classes, max_shard_bytes)
        except PlanError as e:
            raise PlanFailed(str(e)) from None
        if len(_CACHE) >= _CACHED_PLANS:
            _CACHE.pop(next(iter(_CACHE)))
        indexes = {prefix: json.dumps(layout.shards_index(made.specs[prefix], made.files[prefix]), indent=1,
                                      sort_keys=True).encode() for prefix in made.specs}
        _CACHE[key] = made, indexes
    agreed, indexes = _CACHE[key]
    meta = None
    if agreed.optimizer is not None:
        meta = optimizer_meta([(names, gathered[r][1][i]) for names, r, i in agreed.groups], agreed.optimizer)
    return Agreed(agreed, meta, exchanged, indexes)
