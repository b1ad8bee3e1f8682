"""The only module that installs signal handlers. A handler records a stop request, nothing more.

Saving, agreeing with the other ranks and exiting happen at the next step boundary, in normal
code, because almost nothing is safe inside a signal handler (locks, I/O, collectives).

SIGINT (Ctrl-C) is a stop request like SIGTERM. On the launcher's side a second Ctrl-C within
`FORCE_WINDOW_S` of the first asks to exit at once, without the save: the handler only marks it,
and the launcher's loop kills the ranks. A launcher starts its ranks with the stop signals blocked
(`stop_signals_held`), so a signal that arrives while a rank still imports torch stays pending
instead of killing it with a traceback; `install_stop_handlers` unblocks them once they are
handled, and the pending one is recorded then.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
FORCE_WINDOW_S = 5.0
"""A second Ctrl-C this soon after the first exits at once."""


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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    return request


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Stop signals that arrive inside the block wait until it ends, then reach the handlers
    installed meanwhile. A launcher starts its ranks inside: they inherit the block, and so keep a
    signal pending until their own `install_stop_handlers`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def forced(first_interrupt_at: float | None, now: float) -> bool:
    """A Ctrl-C at `now` is the second within the window: exit at once. Pure."""
    return first_interrupt_at is not None and now - first_interrupt_at <= FORCE_WINDOW_S


@dataclass
class Forwarder:
    """Launcher side: each stop signal is passed on at once (to every rank; kill(2) is safe in a
    handler); a second Ctrl-C within the window is not passed on but marked `forced_at`, for the
    launcher's loop to act on."""

    forward: Callable[[int], None]
    interrupted_at: float | None = None
    """time.time() of the Ctrl-C that opened the window."""
    forced_at: float | None = None

    def handle(self, signum: int, _frame: object = None) -> None:
        now = time.time()
        if signum == signal.SIGINT:
            if forced(self.interrupted_at, now):
                self.forced_at = self.forced_at or now
                return
            self.interrupted_at = now
        self.forward(signum)


def forward_signals(signals: tuple[int, ...], forward: Callable[[int], None]) -> Forwarder:
    """Launcher side: pass each of these signals on (e.g. to every rank) instead of acting on it."""
    forwarder = Forwarder(forward)
    for signum in signals:
        signal.signal(signum, forwarder.handle)
    return forwarder
