"""The only module that installs signal handlers. A handler records a stop request, nothing more.

Saving, agreeing with the other ranks and exiting happen at the next step boundary, in normal
code, because almost nothing is safe inside a signal handler (locks, I/O, collectives).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


@dataclass
class StopRequest:
    signum: int | None = None
    received_at: float | None = None
    """time.time() when the first stop signal (or request) arrived."""
    reason: str | None = None
    """Why the job itself asked to stop (a failing node), when no signal did."""

    @property
    def requested(self) -> bool:
        return self.signum is not None or self.reason is not None

    def request(self, reason: str) -> None:
        """A stop asked for by the job itself, from any thread: same handling as a signal."""
        if not self.requested:
            self.reason = reason
            self.received_at = time.time()

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def record(self, signum: int, _frame: object = None) -> None:
        if self.signum is None:
            self.signum = signum
            self.received_at = time.time()


def install_stop_handlers(signals: tuple[int, ...] = STOP_SIGNALS) -> StopRequest:
    """Route the stop signals to a fresh StopRequest (call from the main thread)."""
    request = StopRequest()
    for signum in signals:
        signal.signal(signum, request.record)
    return request


def forward_signals(signals: tuple[int, ...], forward: Callable[[int], None]) -> None:
    """Launcher side: pass each of these signals on (e.g. to every rank) instead of acting on it."""
    for signum in signals:
        signal.signal(signum, lambda s, _f: forward(s))
