"""Without replicas: a buddy re-runs each rank's update and compares (monitor.sdc.rerun_every_steps).

Every N steps each rank keeps its state from before the update (`KeptState`), and after the step
sends it, with the step's gradient and its own result's fingerprints, to its buddy (the same
place on the next node; `roles.buddy_shift`), which re-runs the update on its device and compares
the results bit for bit. The whole step is not re-run: under FSDP2 a rank's gradient is reduced
with every other rank's inside the backward, so no other device can recompute one rank's part of
the forward and backward alone; the update (and the weights at rest around it) is the part of a
step that one rank computes by itself.

What it catches: a wrong update on the rank's device (a fault once, or every time, since the
buddy is another device), and weights or optimizer state that changed at rest between the copy
and the comparison. What it cannot: a corruption in the forward or backward, or in the gradient's
reduction (the buddy re-runs from the same gradient), or one at rest outside the checked steps.

A difference is settled by a third rank's re-run (or, in a job of two ranks, by the rank's own
re-run in place; `verdict.settle_rerun`); a wrong rank takes the buddy's re-run as its state.
"""

from __future__ import annotations

import time
from typing import Any

from resilient_slurm.ledger import Sdc
from resilient_slurm.replica import roles
from resilient_slurm.replica.shard_heal import adopt
from resilient_slurm.replica.holder import Holder
from resilient_slurm.replica.update_rerun import TensorState, from_parcel, to_parcel
from resilient_slurm.replica.verdict import (EVIDENCE_TENSORS, Dispute, Fingerprint, Opinion, Ruling, as_hex, finding,
                                             settle_rerun)
from resilient_slurm.replica.wire import exchange


def check(h: Holder, step: int) -> Sdc | None:
    """Every rank, at a checked step: None when every buddy agreed; else the finding, healed or not."""
    comm = h.comm
    shift = roles.buddy_shift(h.nodes)
    buddy, pred = (comm.rank + shift) % comm.world_size, (comm.rank - shift) % comm.world_size
    everything = tuple(range(len(h.params)))
    parcel = to_parcel(list(zip(h.before(everything), h.grads(everything))), {"after": h.rows(h.params)})
    got = exchange([(buddy, parcel)], [pred], comm.device)[pred]
    redone = h.rerun(from_parcel(got))
    theirs = tuple((int(a), int(b)) for a, b in got.meta["after"])
    checked = h.rows([x.param for x in redone])
    disputed = tuple(i for i, (x, y) in enumerate(zip(theirs, checked)) if x != y)
    if not comm.count(bool(disputed)):
        return None
    found = time.perf_counter()
    mine = Dispute(pred, (pred, comm.rank), disputed, {pred: tuple(theirs[i] for i in disputed),
                                                       comm.rank: tuple(checked[i] for i in disputed)}) \
        if disputed else None
    disputes: list[Dispute] = [d for d in comm.all_gather_object(mine) if d is not None]
    rulings, extra = _settle(h, disputes)
    healed = _heal(h, disputes, rulings, redone)
    verified = not comm.count(any(
        d.shard == comm.rank and h.rows([h.params[t] for t in d.tensors]) != d.after[d.members[1]]
        for d, r in zip(disputes, rulings) if d.shard in r.culprits))
    sources = sorted(d.members[1] for d, r in zip(disputes, rulings) if d.shard in r.culprits)
    return finding("rerun", disputes, rulings, extra, h.names, h.nodes,
                   ", ".join(f"rank {r}" for r in sources) if healed else None, time.perf_counter() - found, verified)


def _settle(h: Holder, disputes: list[Dispute]) -> tuple[list[Ruling], list[dict[str, Any]]]:
    """A third rank's re-run of each dispute's update (or the holder's own, in place)."""
    rank = h.comm.rank
    plan = [(d, d.shard, d.members[1], roles.third_rank(h.nodes, d.members)) for d in disputes]
    facts: dict[int, tuple[Fingerprint, ...]] = {}
    sends, receives = [], []
    for i, (d, holder, _, third) in enumerate(plan):
        if rank == holder:
            items = list(zip(h.before(d.tensors), h.grads(d.tensors)))
            if third is None:
                facts[i] = h.rows([x.param for x in h.rerun(items)])
            else:
                sends.append((third, to_parcel(items, {"dispute": i})))
        if rank == third:
            receives.append(holder)
    for parcel in exchange(sends, receives, h.comm.device).values():
        facts[parcel.meta["dispute"]] = h.rows([x.param for x in h.rerun(from_parcel(parcel))])
    everyone = h.comm.all_gather_object(facts)
    rulings, extra = [], []
    for i, (d, holder, checker, third) in enumerate(plan):
        opinion = None if third is None else Opinion(third, everyone[third][i], rerun_of=holder)
        in_place = everyone[holder][i] if third is None else None
        rulings.append(settle_rerun(holder, checker, d.after[holder], d.after[checker], opinion, in_place))
        by = third if third is not None else holder
        extra += [{"rank": by, "node": h.nodes[by], "rerun_of": holder, "tensor": h.names[t], "fingerprint": as_hex(fp)}
                  for t, fp in list(zip(d.tensors, everyone[by][i]))[:EVIDENCE_TENSORS]]
    return rulings, extra


def _heal(h: Holder, disputes: list[Dispute], rulings: list[Ruling], redone: list[TensorState]) -> bool:
    """Each wrong holder takes its buddy's re-run of its whole shard (weights and optimizer state)."""
    rank = h.comm.rank
    wrong = [(d.shard, d.members[1]) for d, r in zip(disputes, rulings) if r.decided and d.shard in r.culprits]
    sends = [(holder, to_parcel([(x, None) for x in redone], {})) for holder, checker in wrong if checker == rank]
    receives = [checker for holder, checker in wrong if holder == rank]
    for parcel in exchange(sends, receives, h.comm.device).values():
        adopt(h.params, h.optimizer, [state for state, _ in from_parcel(parcel)])
    return bool(wrong) and all(r.decided for r in rulings)
