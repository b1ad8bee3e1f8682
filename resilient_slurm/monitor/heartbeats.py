"""Heartbeats: what a rank tells the monitor outside the training processes, when its silence is a
hang, and whom the others wait for. Pure: the rank's sender (`session/heartbeat.py`) and the
monitor's receiver (`supervise/heartbeat.py`) do the I/O; this decides.

A beat says a rank made progress: a step, a micro-batch, a phase of a save. A phase that may take
longer without making progress (the start, a resume's load, a save, an evaluation) announces itself
with an allowance: until the next beat, the rank may stay silent that long. Each rank also says it
is alive (`ALIVE`, twice a second from a thread of its own), and a closing rank says it exits.

A rank is hung (`silent_ranks`) when it makes no progress
- and is not alive either, for `alive_s`, while it trains (no phase allowance) or waits in a
  phase that only waits on other processes (`WAITS`: a replica group's quorum): its process is
  stopped (SIGSTOP, a debugger), gone with its node, or stuck holding the interpreter; found in
  seconds;
- or for longer than its limit, alive or not: the timeout, or `factor` times its own typical gap
  between beats (a large model's long micro-batches), or the allowance of its phase. Before its
  first beat a rank gets the start allowance, counted from when the monitor started the step, and
  so it does until its typical gap is known (its first few beats).
A rank that waited for a replica group the driver has just replaced (`RankState.waited_at`) is
silent only from then: that group held its collective or quorum until it was gone.

Whom the others wait for (`wavefront`): every beat carries each process group's sequence number,
the count of collectives the rank issued on it. Ranks blocked in collective N of a group report N;
a rank that never entered it reports less. So in the group where the members disagree, the ranks
behind the front are the ones the others wait in collective N for: the culprits, with their nodes,
in the `hang` record. When no group disagrees (every rank entered, none finishes: a GPU or network
fault inside the collective), the culprits are the silent ranks that are not alive, or all of them
(`culprits`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ALIVE = "alive"
"""The phase of a liveness beat: the process runs, whether or not its loop makes progress."""
EXIT = "exit"
"""The phase of a closing rank's last beat: no liveness beats follow."""
PROGRESS = ("step", "micro_batch")
"""Phases of training itself (no allowance): where a typical gap between beats is learnt."""
WAITS = ("quorum",)
"""Phases whose allowance covers waiting on other processes only (the network, the interpreter
free for the liveness thread), unlike a save's or a heal's work: a rank there that is not alive is
hung at once, as in training. A replica group's rank spends much of a short step in its quorum."""
GAP_HISTORY = 20


@dataclass(frozen=True)
class Beat:
    rank: int
    step: int
    phase: str
    """step, micro_batch, start, load, save, eval, await_restart, alive, exit, ..."""
    allow_s: float
    """How long the rank may now stay silent (0: the monitor's limit)."""
    generation: int = 0
    """Which start of the ranks it belongs to (an in-process restart begins a new one)."""
    collectives: tuple[tuple[str, str, int], ...] = ()
    """(group name, description, sequence number of its newest collective) per process group."""
    waiting_s: float | None = None
    """How long the training thread has been waiting in a collective (None: it is not waiting)."""
    sections: Mapping[str, float] = field(default_factory=dict)
    """The step's sections (a `step` beat): data, forward, backward, optimizer, collective, step."""

    def encode(self) -> bytes:
        extra = {"c": [list(c) for c in self.collectives], "w": self.waiting_s, "s": dict(self.sections)}
        return json.dumps([self.rank, self.step, self.phase, self.allow_s, self.generation, extra]).encode()

    @staticmethod
    def decode(data: bytes) -> Beat | None:
        try:
            rank, step, phase, allow_s, generation, *rest = json.loads(data)
            extra = rest[0] if rest else {}
            return Beat(int(rank), int(step), str(phase), float(allow_s), int(generation),
                        tuple((str(n), str(d), int(s)) for n, d, s in extra.get("c", ())),
                        None if extra.get("w") is None else float(extra["w"]),
                        {str(k): float(v) for k, v in (extra.get("s") or {}).items()})
        except (ValueError, TypeError, AttributeError):
            return None  # not ours, or torn: never a reason to fail the run


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    """No progress for this long is a hang (monitor.heartbeat_timeout_s; 0 turns heartbeats off) ..."""
    factor: float
    """... nor for `factor` times the rank's typical gap between beats, when that is longer ..."""
    alive_s: float
    """... and neither progress nor liveness for this long, while training, is one at once."""
    start_allow_s: float
    """Before a rank's first beat."""


@dataclass
class RankState:
    """What the monitor knows of one rank (monitor's clock: time.monotonic())."""

    last: Beat | None = None
    """Its newest progress beat."""
    last_at: float = 0.0
    alive_at: float | None = None
    newest: Beat | None = None
    """Its newest beat of any kind: where its collectives are."""
    gaps: list[float] = field(default_factory=list)
    exited: bool = False
    waited_at: float = 0.0
    """When a replica group it waited for was replaced (the driver's word): it could not progress
    while that group held its collective or quorum, so its silence counts from then at the latest."""

    def receive(self, beat: Beat, now: float) -> None:
        self.newest = beat
        self.exited = beat.phase == EXIT  # a rank that closed one heartbeat may open another (a rejoin)
        if beat.phase in (ALIVE, EXIT):
            self.alive_at = now
            return
        if self.last is not None and self.last.phase in PROGRESS and beat.phase in PROGRESS:
            self.gaps = (self.gaps + [now - self.last_at])[-GAP_HISTORY:]
        self.last, self.last_at, self.alive_at = beat, now, now

    def typical_gap_s(self) -> float | None:
        return statistics.median(self.gaps) if len(self.gaps) >= 3 else None


@dataclass(frozen=True)
class Silence:
    rank: int
    silent_s: float
    step: int | None
    """The last step the rank reported (None: it never reported)."""
    phase: str
    limit_s: float
    alive: bool = False
    """The rank's process still says it is alive: it waits (for a hung peer), it is not itself stopped."""

    def describe(self) -> str:
        where = f"after step {self.step} ({self.phase})" if self.step is not None else "since its start"
        state = "" if self.alive else ", not alive"
        return f"rank {self.rank} silent for {self.silent_s:.1f}s {where}{state}; the limit was {self.limit_s:.1f}s"


def silent_ranks(states: Mapping[int, RankState], ranks: Iterable[int], now: float, started_at: float,
                 limits: Limits) -> list[Silence]:
    """The ranks of `ranks` that are hung at `now` (see the module's rules)."""
    if limits.timeout_s <= 0:
        return []
    out = []
    for rank in ranks:
        s = states.get(rank) or RankState()
        if s.exited:
            continue
        alive = s.alive_at is not None and now - s.alive_at <= limits.alive_s
        if s.last is None:
            limit = max(limits.timeout_s, limits.start_allow_s)
            if now - started_at > limit:
                out.append(Silence(rank, now - started_at, None, "start", limit, alive))
            continue
        quiet = now - max(s.last_at, s.waited_at)
        limit = max(limits.timeout_s, s.last.allow_s, _own_limit(s, limits))
        watched = s.last.allow_s <= 0 or s.last.phase in WAITS
        if quiet > limit or (watched and not alive and quiet > limits.alive_s):
            out.append(Silence(rank, quiet, s.last.step, s.last.phase, limit if quiet > limit else limits.alive_s,
                               alive))
    return out


def _own_limit(s: RankState, limits: Limits) -> float:
    """`factor` times the rank's typical gap; until that is known (its first beats after a start,
    which may be slower: allocation, compilation), the start allowance."""
    if limits.factor <= 0:
        return 0.0
    gap = s.typical_gap_s()
    return limits.start_allow_s if gap is None else limits.factor * gap


@dataclass(frozen=True)
class Wavefront:
    """A collective some ranks wait in while others never entered it."""

    group: str
    desc: str
    seq: int
    """The collective's sequence number in its group: the front."""
    waiting: tuple[int, ...]
    """Ranks that entered it."""
    behind: tuple[tuple[int, int], ...]
    """(rank, the sequence number it reached) of each member that did not."""

    @property
    def culprits(self) -> tuple[int, ...]:
        return tuple(r for r, _ in self.behind)

    def describe(self, nodes: Mapping[int, str] | None = None) -> str:
        def who(ranks: Iterable[int]) -> str:
            return ", ".join(f"{r} ({nodes[r]})" if nodes and r in nodes else str(r) for r in ranks)
        name = f"group {self.group}" + (f" ({self.desc})" if self.desc and self.desc != "undefined" else "")
        behind = "; ".join(f"rank {who([r])} at #{s}" for r, s in self.behind)
        return (f"{behind} by its last beat, while rank{'s' if len(self.waiting) > 1 else ''} {who(self.waiting)} "
                f"wait{'' if len(self.waiting) > 1 else 's'} in collective #{self.seq} of {name}")

    def as_record(self) -> dict[str, object]:
        return {"group": self.group, "desc": self.desc, "seq": self.seq, "waiting": list(self.waiting),
                "behind": {str(r): s for r, s in self.behind}}


def wavefront(states: Mapping[int, RankState], ranks: Iterable[int]) -> Wavefront | None:
    """The group whose members disagree on how many collectives they issued, from each rank's newest
    beat: the largest such group (ties by name), or None when every group agrees."""
    seqs: dict[str, dict[int, int]] = {}
    descs: dict[str, str] = {}
    for rank in ranks:
        beat = (states.get(rank) or RankState()).newest
        for name, desc, seq in beat.collectives if beat is not None else ():
            seqs.setdefault(name, {})[rank] = seq
            descs[name] = desc
    split = [(name, members) for name, members in seqs.items() if len(set(members.values())) > 1]
    if not split:
        return None
    name, members = max(split, key=lambda nm: (len(nm[1]), nm[0]))
    front = max(members.values())
    return Wavefront(name, descs[name], front, tuple(sorted(r for r, s in members.items() if s == front)),
                     tuple(sorted((r, s) for r, s in members.items() if s < front)))


def culprits(silent: list[Silence], front: Wavefront | None = None) -> list[Silence]:
    """The silent ranks that are hung themselves: those the others wait for in a collective; else
    those no longer alive; else all of them (deadlocked together)."""
    if front is not None:
        named = [s for s in silent if s.rank in front.culprits]
        if named:
            return named
    dead = [s for s in silent if not s.alive]
    return dead or list(silent)
