"""The data position: one global counter plus the phase it lies in, never per-rank iterator state.

A run's data is a sequence of phases. A phase has a name, the global sequence at which it began and,
per source, its fingerprint, its weight, `base` (how far that source's own order had got when the
phase began) and `before` (sequences of it trained in earlier phases). Global sequence p of the
phase is the plan's position p - start (plan.py); its source's counter is base + the plan's count.
So the whole position is `sequences` (global sequences consumed) with the phase record: every rank
at any world size derives the same global batches from it.

Resuming checks the saved phase against the configured one (`continue_phase`):
- same phase name: the same sources with the same fingerprints and weights, else refused, naming
  the source and the two ways out (restore it, or begin a new phase);
- another name (`data.phase=anneal`): a new phase begins at the saved counter. A source that keeps
  its name and files continues its own order where it stood (its windows are not replayed); a new
  one starts at its beginning. The phase that ended goes to `history` with its end.
seq_len, seed and val_sequences define the windows themselves and may not change within a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from resilient_slurm.data.tokens.errors import TokenDataError

NEW_PHASE = "restore them, or begin a new data phase from this step (data.phase=NAME)"


@dataclass(frozen=True)
class PhaseSource:
    name: str
    digest: str
    weight: float
    base: int = 0
    """The source's own counter when the phase began."""
    before: int = 0
    """Sequences of this source (by name) trained in earlier phases."""


@dataclass(frozen=True)
class Phase:
    name: str
    start: int
    """Global sequence at which the phase began."""
    sources: tuple[PhaseSource, ...]

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start, "sources": [asdict(s) for s in self.sources]}

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> Phase:
        return Phase(record["name"], int(record["start"]), tuple(PhaseSource(**s) for s in record["sources"]))


@dataclass(frozen=True)
class Windows:
    """What defines the windows of every source: fixed for the whole run."""

    seq_len: int
    seed: int
    val_sequences: int


def continue_phase(saved: Mapping[str, Any] | None, name: str, sources: Sequence[tuple[str, str, float]],
                   windows: Windows) -> tuple[Phase, list[dict[str, Any]]]:
    """The phase the run continues in, and the history of the phases before it. `sources` are the
    configured (name, fingerprint, weight); `saved` a position() saved by the run, or None."""
    if saved is None:
        return Phase(name, 0, tuple(PhaseSource(n, d, w) for n, d, w in sources)), []
    for key in ("seq_len", "seed", "val_sequences"):
        if saved[key] != getattr(windows, key):
            raise TokenDataError(f"data.{key}: {getattr(windows, key)}, but the run's data position was saved at "
                                 f"{saved[key]}, which defines its windows; set it back, or start a new run")
    phase = Phase.from_record(saved["phase"])
    if phase.name == name:
        _check_same(phase, sources)
        return phase, list(saved["history"])
    at = int(saved["sequences"])
    stood = saved["sources"]
    new = tuple(PhaseSource(n, d, w, base=int(stood[n]["counter"]) if n in stood and stood[n]["digest"] == d else 0,
                            before=int(stood[n]["trained"]) if n in stood else 0) for n, d, w in sources)
    ended = {**phase.to_record(), "end": at}
    return Phase(name, at, new), [*saved["history"], ended]


def _check_same(phase: Phase, sources: Sequence[tuple[str, str, float]]) -> None:
    saved = {s.name: s for s in phase.sources}
    for n, digest, weight in sources:
        if n not in saved:
            raise TokenDataError(f"data.sources[{n}]: not a source of data phase {phase.name!r}, in which the run was "
                                 f"saved; remove it, or begin a new data phase from this step (data.phase=NAME)")
        if saved[n].digest != digest:
            raise TokenDataError(f"data.sources[{n}]: its files changed since data phase {phase.name!r} began "
                                 f"(fingerprint {saved[n].digest[:12]} -> {digest[:12]}); {NEW_PHASE}")
        if saved[n].weight != weight:
            raise TokenDataError(f"data.sources[{n}].weight: {saved[n].weight:g} -> {weight:g} since data phase "
                                 f"{phase.name!r} began; set it back, or begin a new data phase (data.phase=NAME)")
    gone = sorted(set(saved) - {n for n, _, _ in sources})
    if gone:
        raise TokenDataError(f"data.sources: source {gone[0]} of data phase {phase.name!r} is gone; restore it, or "
                             "begin a new data phase from this step (data.phase=NAME)")
