"""The monitor's side of the heartbeats: a UDP socket the ranks beat to, read by a thread, and the
questions the launcher or the driver asks it at every poll: which ranks are silent, whom the others
wait for, and which rank is a straggler (`monitor.heartbeats` and `monitor.stragglers` decide). One
monitor serves a whole run; each start of the ranks (a step, an in-process restart) calls `restart`
so the start allowance counts from then, and beats of an older start are ignored.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from resilient_slurm.monitor.heartbeats import Beat, Limits, RankState, Silence, Wavefront, silent_ranks, wavefront
from resilient_slurm.monitor.stragglers import Straggler, StragglerDetector

if TYPE_CHECKING:
    from resilient_slurm.config import MonitorConfig

MAX_DATAGRAM = 65507
STEPS_KEPT = 16
"""Steps whose sections wait for the ranks that have not sent theirs yet (UDP may lose a beat)."""


class HeartbeatMonitor:
    def __init__(self, host: str, cfg: MonitorConfig) -> None:
        self.limits = Limits(cfg.heartbeat_timeout_s, cfg.heartbeat_factor, cfg.heartbeat_alive_s,
                             cfg.heartbeat_phase_s)
        self.straggler_cfg = cfg.straggler
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.5)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._states: dict[int, RankState] = {}
        self._rows: dict[int, dict[int, dict[str, float]]] = {}
        self._found: list[Straggler] = []
        self.world = 0
        self.detector = self._detector()
        self.generation = 0
        self.started_at = time.monotonic()
        self._started: dict[int, float] = {}
        """Ranks started anew since the start (a replica group's replacement): when each was."""
        self._closed = False
        self._thread = threading.Thread(target=self._receive, name="heartbeats", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """What the ranks are told (`RankLaunch.heartbeat`)."""
        return f"{self.host}:{self.port}"

    def restart(self, generation: int = 0, world: int = 0) -> None:
        """A new start of `world` ranks: forget the old beats; the start allowance counts from now."""
        with self._lock:
            self._states.clear()
            self._rows.clear()
            self.generation, self.world = generation, world
            self.detector = self._detector()
            self.started_at = time.monotonic()
            self._started.clear()

    def restart_ranks(self, ranks: Iterable[int]) -> None:
        """Some ranks started anew in the same start (a replica group replaced): their old beats go,
        and their start allowance counts from now."""
        with self._lock:
            for r in ranks:
                self._states.pop(r, None)
                self._started[r] = time.monotonic()

    def waited(self, ranks: Iterable[int]) -> None:
        """These ranks waited for a replica group that was just replaced: their silence counts from
        now (`RankState.waited_at`), not from their last beat before that group stopped."""
        now = time.monotonic()
        with self._lock:
            for r in ranks:
                if r in self._states:
                    self._states[r].waited_at = now

    def silent(self, ranks: Iterable[int]) -> list[Silence]:
        with self._lock:
            states, started = dict(self._states), dict(self._started)
        by_start: dict[float, list[int]] = {}
        for r in ranks:
            by_start.setdefault(started.get(r, self.started_at), []).append(r)
        now = time.monotonic()
        return [s for at, rs in by_start.items() for s in silent_ranks(states, rs, now, at, self.limits)]

    def wavefront(self, ranks: Iterable[int]) -> Wavefront | None:
        """The collective some ranks wait in that others did not enter, by their newest beats."""
        with self._lock:
            return wavefront(self._states, list(ranks))

    def stragglers(self) -> list[Straggler]:
        """The stragglers found since the last call."""
        with self._lock:
            found, self._found = self._found, []
        return found

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        self.sock.close()

    def _detector(self) -> StragglerDetector:
        c = self.straggler_cfg
        return StragglerDetector(c.factor, c.steps, c.min_s)

    def _receive(self) -> None:
        while not self._closed:
            try:
                data, _ = self.sock.recvfrom(MAX_DATAGRAM)
            except (TimeoutError, OSError):
                continue
            beat = Beat.decode(data)
            if beat is None:
                continue
            with self._lock:
                if beat.generation != self.generation:
                    continue
                self._states.setdefault(beat.rank, RankState()).receive(beat, time.monotonic())
                if beat.sections and self.world > 1:
                    self._add_sections(beat)

    def _add_sections(self, beat: Beat) -> None:
        """A step's row goes to the detector once every rank sent its sections for it."""
        row = self._rows.setdefault(beat.step, {})
        row[beat.rank] = dict(beat.sections)
        if len(row) == self.world:
            del self._rows[beat.step]
            self._found.extend(self.detector.observe(beat.step, row))
        for old in sorted(self._rows)[:-STEPS_KEPT]:
            del self._rows[old]
