"""The sections of a rank's step, for its heartbeat: data, forward, backward, optimizer, and the
collective wait.

The loop marks its sections (`with sections.timed("forward"): ...`); each gets its wall time less
the collective waits inside it (`collectives.waited_s`), which count as `collective` instead, as
do the waits outside any section. So a rank's own compute is its forward, backward and optimizer,
whatever its peers make it wait: with FSDP2 every rank waits for the slowest inside its forward
and backward, and without the split every rank's forward would look as slow as the slowest one's.
A loop that marks nothing still has its step time and its collective wait (`take`): its compute is
the rest. Not thread-safe: the training thread's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from resilient_slurm.session import collectives

SECTIONS = ("data", "forward", "backward", "optimizer", "collective")


class StepSections:
    def __init__(self) -> None:
        self._spent = dict.fromkeys(SECTIONS, 0.0)
        self._began = time.perf_counter()
        self._waited = collectives.waited_s()

    @contextlib.contextmanager
    def timed(self, section: str) -> Iterator[None]:
        began, waited = time.perf_counter(), collectives.waited_s()
        try:
            yield
        finally:
            self._spent[section] += time.perf_counter() - began - (collectives.waited_s() - waited)

    def take(self) -> dict[str, float]:
        """This step's sections (seconds) and `step`, its wall time, since the last take; starts the next."""
        now, waited = time.perf_counter(), collectives.waited_s()
        out = {**self._spent, "collective": waited - self._waited, "step": now - self._began}
        self._spent = dict.fromkeys(SECTIONS, 0.0)
        self._began, self._waited = now, waited
        return {k: round(v, 6) for k, v in out.items()}
