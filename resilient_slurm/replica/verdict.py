"""Who is wrong when copies that must be equal are not. Pure.

An `Opinion` is one device's value of the disputed tensors: a replica's shard as it holds it after
the update, or a re-run of that update from the state before it (on a third rank, or on a buddy).
`rule` takes the value held by more than half of the opinions, tensor by tensor, as the truth:
the devices whose opinion differs from it are the culprits (a re-run that comes out wrong blames
the rank that re-ran it, not the shard's holder). Without a majority for some tensor nothing is
decided.

Two replicas can never outvote each other: `settle_tie` first rules out what a re-run of the update
cannot settle (their states before the update already differed, or the step's reduced gradient
did), then asks the third opinion. `heal_sources` turns the rulings into the replica each shard is
copied from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resilient_slurm.ledger import Sdc

Fingerprint = tuple[int, int]

EVIDENCE_TENSORS = 16
"""Tensors per dispute whose fingerprints the ledger keeps (all are named)."""

MAJORITY, RERUN, UNDECIDED = "majority", "rerun", "undecided"


@dataclass(frozen=True)
class Opinion:
    rank: int | None
    """The device whose computation or memory this value is (None: several ranks that agreed)."""
    fingerprints: tuple[Fingerprint, ...]
    """One per disputed tensor, in the dispute's order."""
    rerun_of: int | None = None
    """A re-run: the rank whose state before the update it started from."""


@dataclass(frozen=True)
class Dispute:
    """Copies of one shard that differ after an update."""

    shard: int
    """Replicas: the rank of the shard's replica 0. A buddy's re-run: the rank whose update it is."""
    members: tuple[int, ...]
    """The ranks whose values differ: the shard's replicas by group, or the rank and its buddy."""
    tensors: tuple[int, ...]
    """Indices of the parameters whose copies differ."""
    after: dict[int, tuple[Fingerprint, ...]]
    """Each member's fingerprints of those tensors (the buddy's: its re-run's)."""


@dataclass(frozen=True)
class Ruling:
    culprits: tuple[int, ...]
    """Ranks whose value is wrong; empty when undecided."""
    good: tuple[int, ...]
    """Ranks that hold the majority's value of every disputed tensor."""
    decided_by: str
    reason: str

    @property
    def decided(self) -> bool:
        return self.decided_by != UNDECIDED


def differing(rows: Sequence[Sequence[Fingerprint]]) -> list[int]:
    """The tensors (indices) whose fingerprint is not the same in every row (one row per copy)."""
    if not rows:
        return []
    return [i for i in range(len(rows[0])) if any(tuple(r[i]) != tuple(rows[0][i]) for r in rows[1:])]


def rule(opinions: Sequence[Opinion], decided_by: str = MAJORITY) -> Ruling:
    """The majority's value of each tensor is the truth; who differs from it is a culprit."""
    n = len(opinions[0].fingerprints) if opinions else 0
    culprits: set[int] = set()
    for i in range(n):
        counts = Counter(o.fingerprints[i] for o in opinions)
        value, held = counts.most_common(1)[0]
        if 2 * held <= len(opinions):
            return Ruling((), (), UNDECIDED, f"no majority among {len(opinions)} copies of tensor {i}: "
                                             f"{len(counts)} different values")
        culprits |= {o.rank for o in opinions if o.fingerprints[i] != value and o.rank is not None}
    good = tuple(sorted({o.rank for o in opinions if o.rank is not None and o.rerun_of is None} - culprits))
    if not culprits:
        return Ruling((), good, UNDECIDED, "every value the majority disagrees with came from several ranks")
    return Ruling(tuple(sorted(culprits)), good, decided_by,
                  f"{len(opinions) - len(culprits)} of {len(opinions)} copies agree")


@dataclass(frozen=True)
class TieFacts:
    """Two replicas `a` and `b` of a shard differ after step K's update: what can settle it."""

    a: int
    b: int
    after: Mapping[int, tuple[Fingerprint, ...]]
    """Each one's disputed tensors now."""
    before: Mapping[int, tuple[Fingerprint, ...]] | None
    """Each one's kept state of them from before the update (None: no state kept)."""
    agreed: tuple[Fingerprint, ...] | None
    """Their values both agreed on at step K-1 (None: not compared then)."""
    grads: Mapping[int, tuple[Fingerprint, ...]]
    """The step's gradient of them, as each holds it."""
    reruns: Sequence[Opinion]
    """Re-runs of the update from the kept state: on a third rank, or in place on a and b."""


def settle_tie(f: TieFacts) -> Ruling:
    """The culprit of two replicas: the one whose state changed at rest before the update, else the
    one the third rank's re-run disagrees with (without a third rank: the one that disagrees with
    what both re-ran alike in place, which catches a transient fault, never a deterministic one)."""
    if f.before is None:
        return Ruling((), (), UNDECIDED, "two replicas differ and no state from before the update was kept "
                                         "(monitor.sdc.rerun_on_tie=false)")
    if f.before[f.a] != f.before[f.b]:
        changed = [r for r in (f.a, f.b) if f.agreed is not None and f.before[r] != f.agreed]
        if len(changed) == 1:
            return Ruling((changed[0],), tuple(r for r in (f.a, f.b) if r != changed[0]), RERUN,
                          f"rank {changed[0]}'s weights changed at rest after the previous step's comparison")
        return Ruling((), (), UNDECIDED, "the two replicas already differed before the update, and no earlier "
                                         "comparison says which one changed")
    if f.grads[f.a] != f.grads[f.b]:
        return Ruling((), (), UNDECIDED, "the step's reduced gradient differs between the two replicas: a re-run "
                                         "of the update cannot say which reduction is wrong")
    mine = [Opinion(f.a, f.after[f.a]), Opinion(f.b, f.after[f.b])]
    third = [o for o in f.reruns if o.rank not in (f.a, f.b)]
    if third:
        ruling = rule(mine + third[:1], RERUN)
        why = f"a re-run on rank {third[0].rank} agrees with rank "
    else:
        in_place = {o.fingerprints for o in f.reruns if o.rank in (f.a, f.b)}
        if len(in_place) != 1:
            return Ruling((), (), UNDECIDED, "no third rank to re-run the update, and the two re-runs in place "
                                             "disagree")
        ruling = rule(mine + [Opinion(None, in_place.pop())], RERUN)
        why = "both re-ran the update alike in place, as rank "
    if not ruling.decided:
        return ruling
    return Ruling(ruling.culprits, ruling.good, RERUN, why + ", ".join(map(str, ruling.good)))


def settle_rerun(holder: int, checker: int, after: tuple[Fingerprint, ...], checked: tuple[Fingerprint, ...],
                 third: Opinion | None, in_place: tuple[Fingerprint, ...] | None) -> Ruling:
    """A buddy (`checker`) re-ran `holder`'s update and got `checked`, not the holder's `after`: a
    third rank's re-run decides. Without one, the holder's own re-run in place decides only when it
    agrees with the buddy (a transient fault or a flip at rest on the holder); when it repeats the
    holder's result, one of the two devices computes wrong every time, and nothing says which."""
    mine = [Opinion(holder, after), Opinion(checker, checked, rerun_of=holder)]
    if third is not None:
        ruling = rule(mine + [third], RERUN)
        return Ruling(ruling.culprits, ruling.good, ruling.decided_by,
                      f"a re-run on rank {third.rank} agrees with rank(s) "
                      f"{', '.join(str(r) for r in (holder, checker) if r not in ruling.culprits)}"
                      if ruling.decided else ruling.reason)
    if in_place is not None and in_place == checked:
        return Ruling((holder,), (checker,), RERUN, f"rank {holder}'s own re-run agrees with its buddy's")
    return Ruling((), (), UNDECIDED, f"no third rank, and rank {holder}'s own re-run repeats its result: one of "
                                     f"ranks {holder} and {checker} computes the update wrong every time")


def heal_sources(rulings: Sequence[tuple[int, Ruling]], groups: int, group_of: Mapping[int, int]) \
        -> tuple[dict[int, int], int | None]:
    """Where each shard is copied from after `rulings` (each with the shard it was about): by shard,
    the group of its ruling's first good rank; for every other shard, the lowest group no ruling
    blamed (None: each group holds some culprit, and shards without a dispute stay as they are)."""
    blamed = {group_of[r] for _, ruling in rulings for r in ruling.culprits}
    default = next((g for g in range(groups) if g not in blamed), None)
    by_shard = {shard: group_of[ruling.good[0]] for shard, ruling in rulings if ruling.decided and ruling.good}
    return by_shard, default


def as_hex(row: Sequence[int]) -> str:
    """A fingerprint as the ledger spells it: the two sums, 16 hex digits each."""
    return "".join(f"{int(x) & (2**64 - 1):016x}" for x in row)


def finding(check: str, disputes: Sequence[Dispute], rulings: Sequence[Ruling], extra: list[dict[str, Any]],
            names: Sequence[str], nodes: Sequence[str], source: str | None, seconds: float, verified: bool,
            group_size: int | None = None) -> Sdc:
    """The `sdc` event of a check whose copies differed (`extra`: the re-runs' fingerprints). Each
    copy's group in the evidence is its position among the dispute's members (HSDP's replica index),
    or, across replica groups (`group_size` ranks each), its rank's own group, whichever are live."""
    culprits = sorted({r for ruling in rulings for r in ruling.culprits})
    decided = bool(rulings) and all(r.decided for r in rulings)
    evidence = [{"rank": m, "group": None if check != "replicas" else m // group_size if group_size else g,
                 "node": nodes[m], "tensor": names[t],
                 "fingerprint": as_hex(fp)}
                for d in disputes for g, m in enumerate(d.members)
                for t, fp in list(zip(d.tensors, d.after[m]))[:EVIDENCE_TENSORS]]
    return Sdc(check=check, tensors=sorted({names[t] for d in disputes for t in d.tensors}),
               ranks=culprits if decided else [], nodes=[nodes[r] for r in culprits] if decided else [],
               suspects=sorted({nodes[m] for d, r in zip(disputes, rulings) if not r.decided for m in d.members}),
               decided_by=rulings[0].decided_by if decided else UNDECIDED, evidence=evidence + extra,
               action="healed" if decided else UNDECIDED, source=source,
               heal_s=round(seconds, 6) if decided else None, verified=verified,
               reason="; ".join(dict.fromkeys(r.reason for r in rulings)))
