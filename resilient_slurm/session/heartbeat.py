"""A rank's heartbeat: one UDP datagram to the monitor outside the training processes (the local
launcher or the Slurm job's driver) at each sign of progress. Progress beats are sent from the
training thread only, on purpose: a beat from a thread of its own would go on while the loop is
stuck; a thread of its own only says the process is alive (`monitor.heartbeats.ALIVE`). Sending never
blocks and never fails the run; without a monitor (one rank in-process, a Slurm job without a
driver: the hang watchdog covers those) it is a null object.
"""

from __future__ import annotations

import os
import socket
import threading

from resilient_slurm.monitor.heartbeats import ALIVE, Beat

HEARTBEAT_ENV = "RESILIENT_SLURM_HEARTBEAT"
"""`host:port` of the monitor, set by the launcher in each rank's environment."""
ALIVE_EVERY_S = 1.0


class Heartbeat:
    def __init__(self, address: tuple[str, int] | None, rank: int, generation: int = 0) -> None:
        self.address, self.rank, self.generation = address, rank, generation
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if address else None
        self._stop = threading.Event()
        if self.sock is not None:
            self.sock.setblocking(False)
            # Liveness only (monitor.heartbeats.ALIVE): it tells a waiting rank from a stopped one.
            threading.Thread(target=self._alive, name="heartbeat-alive", daemon=True).start()

    @classmethod
    def from_env(cls, rank: int, generation: int = 0) -> Heartbeat:
        host, _, port = os.environ.get(HEARTBEAT_ENV, "").rpartition(":")
        return cls((host, int(port)) if host and port.isdigit() else None, rank, generation)

    def beat(self, step: int, phase: str = "step", allow_s: float = 0.0) -> None:
        """Progress at `step`; a phase that may stay silent longer than the timeout gives `allow_s`."""
        if self.sock is None or self.address is None:
            return
        try:
            self.sock.sendto(Beat(self.rank, step, phase, allow_s, self.generation).encode(), self.address)
        except OSError:
            pass  # a full buffer or a monitor gone: the next beat tries again

    def close(self) -> None:
        self._stop.set()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _alive(self) -> None:
        while not self._stop.wait(ALIVE_EVERY_S):
            self.beat(-1, ALIVE)
