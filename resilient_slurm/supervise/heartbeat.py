"""The monitor's side of the heartbeats: a UDP socket the ranks beat to, read by a thread, and the
question the launcher or the driver asks it at every poll: which ranks are silent (`monitor.heartbeats`
decides). One monitor serves a whole run; each start of the ranks (a step, an in-process restart)
calls `restart` so the start allowance counts from then, and beats of an older start are ignored.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable

from resilient_slurm.monitor.heartbeats import ALIVE, Beat, Silence, silent_ranks


class HeartbeatMonitor:
    def __init__(self, host: str, timeout_s: float, start_allow_s: float) -> None:
        self.timeout_s, self.start_allow_s = timeout_s, start_allow_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.5)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._last: dict[int, tuple[Beat, float]] = {}
        self._alive: dict[int, float] = {}
        self.generation = 0
        self.started_at = time.monotonic()
        self._started: dict[int, float] = {}
        """Ranks started anew since the start (a replica group's replacement): when each was."""
        self._closed = False
        self._thread = threading.Thread(target=self._receive, name="heartbeats", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """What the ranks get in RESILIENT_SLURM_HEARTBEAT."""
        return f"{self.host}:{self.port}"

    def restart(self, generation: int = 0) -> None:
        """A new start of the ranks: forget the old beats; the start allowance counts from now."""
        with self._lock:
            self._last.clear()
            self._alive.clear()
            self.generation = generation
            self.started_at = time.monotonic()
            self._started.clear()

    def restart_ranks(self, ranks: Iterable[int]) -> None:
        """Some ranks started anew in the same start (a replica group replaced): their old beats go,
        and their start allowance counts from now."""
        with self._lock:
            for r in ranks:
                self._last.pop(r, None)
                self._alive.pop(r, None)
                self._started[r] = time.monotonic()

    def silent(self, ranks: Iterable[int]) -> list[Silence]:
        with self._lock:
            last, alive, started = dict(self._last), dict(self._alive), dict(self._started)
        by_start: dict[float, list[int]] = {}
        for r in ranks:
            by_start.setdefault(started.get(r, self.started_at), []).append(r)
        now = time.monotonic()
        return [s for at, rs in by_start.items()
                for s in silent_ranks(last, rs, now, at, self.timeout_s, self.start_allow_s, alive)]

    def last_beat(self, rank: int) -> tuple[Beat, float] | None:
        """A rank's newest beat and when it came (time.monotonic())."""
        with self._lock:
            return self._last.get(rank)

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        self.sock.close()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data, _ = self.sock.recvfrom(512)
            except (TimeoutError, OSError):
                continue
            beat = Beat.decode(data)
            if beat is not None:
                with self._lock:
                    if beat.generation != self.generation:
                        continue
                    if beat.phase == ALIVE:
                        self._alive[beat.rank] = time.monotonic()
                    else:
                        self._last[beat.rank] = (beat, time.monotonic())
