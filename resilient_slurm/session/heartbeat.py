"""A rank's heartbeat: one UDP datagram to the monitor outside the training processes (the local
launcher or the Slurm job's driver) at each sign of progress. Progress beats are sent from the
training thread only, on purpose: a beat from a thread of its own would go on while the loop is
stuck; a thread of its own only says the process is alive (`monitor.heartbeats.ALIVE`, every
`ALIVE_EVERY_S`). Sending never blocks and never fails the run; without a monitor (one rank
in-process, a Slurm job without a driver: the hang watchdog covers those) it is a null object.

Every beat carries where the rank's collectives are (each process group's sequence number, and how
long the training thread has waited in the current one: `collectives.py`), so that the monitor can
name the rank the others wait for. The beat at the end of a step carries the step's sections (data,
forward, backward, optimizer, collective wait: `sections.py`), which the monitor's straggler
detection compares across ranks. A phase that may take longer (a save, a load, an evaluation)
restarts the sections, so the next step's do not hold it. Closing says so (`EXIT`): the process
may take a while to end (its last save finishing), and no more liveness beats come.
"""

from __future__ import annotations

import socket
import threading

from resilient_slurm.monitor.heartbeats import ALIVE, EXIT, PROGRESS, Beat
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.session import collectives
from resilient_slurm.session.sections import StepSections

ALIVE_EVERY_S = 0.5
EXIT_ALLOW_S = 600.0
"""How long a closing rank may take to exit (its last save finishing) before its silence counts."""


class Heartbeat:
    def __init__(self, address: tuple[str, int] | None, rank: int, generation: int = 0) -> None:
        self.address, self.rank, self.generation = address, rank, generation
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if address else None
        self.sections = StepSections()
        """The loop marks its step's sections here; the step's beat sends them."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        collectives.install()  # the training thread's waits: it is the one that makes the heartbeat
        if self.sock is not None:
            self.sock.setblocking(False)
            # Liveness only (monitor.heartbeats.ALIVE): it tells a waiting rank from a stopped one.
            self._thread = threading.Thread(target=self._alive, name="heartbeat-alive", daemon=True)
            self._thread.start()

    @classmethod
    def from_env(cls, rank: int, generation: int | None = None) -> Heartbeat:
        """To the monitor the launcher named (`RankLaunch.heartbeat`); the generation is the launch's
        unless given."""
        import os

        launch = RankLaunch.from_env(os.environ)
        host, _, port = launch.heartbeat.rpartition(":")
        return cls((host, int(port)) if host and port.isdigit() else None, rank,
                   launch.generation if generation is None else generation)

    def beat(self, step: int, phase: str = "step", allow_s: float = 0.0) -> None:
        """Progress at `step`; a phase that may stay silent longer than the timeout gives `allow_s`."""
        if phase == "step":
            self._send(step, phase, allow_s, self.sections.take())
            return
        if phase not in PROGRESS:
            self.sections.take()  # a save, a load, an evaluation: not the next step's
        self._send(step, phase, allow_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # its last liveness beat before the exit beat, never after it
        self._send(-1, EXIT, EXIT_ALLOW_S)
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _send(self, step: int, phase: str, allow_s: float, sections: dict[str, float] | None = None) -> None:
        sock, address = self.sock, self.address
        if sock is None or address is None:
            return
        beat = Beat(self.rank, step, phase, allow_s, self.generation, collectives.sequences(),
                    collectives.waiting_s(), sections or {})
        try:
            sock.sendto(beat.encode(), address)
        except OSError:
            pass  # a full buffer or a monitor gone: the next beat tries again

    def _alive(self) -> None:
        while not self._stop.wait(ALIVE_EVERY_S):
            self._send(-1, ALIVE, 0.0)
