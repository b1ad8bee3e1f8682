"""The hang watchdog: a thread outside the training loop that notices when no step completes.

On a hang it dumps every thread's stack of this rank (faulthandler; py-spy's native frames too
when it is installed) and its flight recorder's collectives (`collectives.dump_flight_recorder`)
into the run's logs, records the event, hands the outcome to the caller's
handler (which may requeue the job), and ends the process: the main thread is stuck, in a
collective or in a kernel, and cannot be asked to stop. Every rank runs its own watchdog. The
first to fire leaves a marker in the (shared) logs directory; the others see it within a second
and dump their stacks too, before the first one's exit breaks their collectives.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from resilient_slurm.config import MonitorConfig
from resilient_slurm.ledger import EventLog, Hang, StacksDumped
from resilient_slurm.monitor.detectors import hang_timeout_s
from resilient_slurm.monitor.hang_dumps import HANG_MARKER, PEER_DUMP_GRACE_S, PY_SPY_TIMEOUT_S
from resilient_slurm.session.collectives import dump_flight_recorder

POLL_S = 0.25


class Watchdog:
    def __init__(self, cfg: MonitorConfig, logs: Path, events: EventLog, rank: int,
                 on_hang: Callable[[int, str], None], exit_code: int) -> None:
        self.cfg, self.logs, self.events, self.rank = cfg, logs, events, rank
        self.on_hang = on_hang
        """Called with (step, reason) before the process ends; it must not block for long."""
        self.exit_code = exit_code
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.step = 0
        self.last_beat = time.monotonic()
        self.started_at = time.time()
        self.answered = 0.0
        """The hang marker's time this rank dumped its stacks for as a peer: once per hang found, since
        with replica groups (cluster.replica_ft) a peer rank trains on after a hang elsewhere."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)

    def start(self) -> None:
        self.last_beat = time.monotonic()
        self.started_at = time.time()
        self._thread.start()

    def beat(self, step: int, step_s: float | None) -> None:
        """A step completed (or the loop moved on: a save, a rollback)."""
        if step_s is not None:
            self.recent.append(step_s)
        self.step = step
        self.last_beat = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            self.look()

    def look(self) -> None:
        """One look: fire on this rank's own hang, or dump as a peer once per hang a peer (or the
        supervisor) found since this rank started."""
        limit = hang_timeout_s(list(self.recent), self.cfg)
        waited = time.monotonic() - self.last_beat
        if waited > limit and claim_hang(self.logs, self.started_at):
            self._fire(waited, limit)
        elif (touched := _mtime(self.logs / HANG_MARKER)) >= self.started_at and touched > self.answered:
            self.answered = touched
            # The flight recorder before the stacks: the monitor kills the ranks once each one's
            # stacks file is there (supervise/hangs.py), so that file must come last.
            dump_flight_recorder(self._dump_path().with_suffix(".flight-recorder.json"))
            dump = self._dump(f"a peer rank found the run hung; this rank waited {waited:.0f}s since step {self.step}")
            self.events.emit(StacksDumped(reason="a peer rank found the run hung", waited_s=round(waited, 1),
                                          stacks=str(dump)), self.step)
            self._native(dump)

    def _dump_path(self) -> Path:
        return self.logs / f"hang-rank{self.rank}-step{self.step}.txt"

    def _dump(self, headline: str) -> Path:
        """The Python stacks, written aside and renamed: the monitor sees the file only complete."""
        dump = self._dump_path()
        part = dump.with_suffix(".txt.part")
        with open(part, "w") as f:
            f.write(f"rank {self.rank}: {headline}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        os.replace(part, dump)
        return dump

    def _native(self, dump: Path) -> None:
        """Native frames too when py-spy is installed. After the Python stacks are on record: it can
        take seconds, and the process may be killed meanwhile (the rank that fired exits at once)."""
        py_spy = shutil.which("py-spy")
        if py_spy:
            try:
                native = subprocess.run([py_spy, "dump", "--native", "--pid", str(os.getpid())],
                                        capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
                with open(dump, "a") as f:
                    f.write("\n--- py-spy dump --native ---\n" + native.stdout + native.stderr)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def _fire(self, waited: float, limit: float) -> None:
        step = self.step
        reason = f"no step completed for {waited:.0f}s (limit {limit:.0f}s) after step {step}"
        dump_flight_recorder(self._dump_path().with_suffix(".flight-recorder.json"))  # before the stacks, as above
        dump = self._dump(reason)
        self.events.emit(Hang(reason=reason, waited_s=round(waited, 1), limit_s=round(limit, 1), stacks=str(dump)),
                         step)
        self._native(dump)
        time.sleep(PEER_DUMP_GRACE_S)
        try:
            self.on_hang(step, reason)
        finally:
            os._exit(self.exit_code)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def claim_hang(logs: Path, since: float) -> bool:
    """Whether this rank is the first since `since` (its start) to find the run hung, and so the one
    to record it: the ranks' watchdogs count from the same step and reach their limit together, and
    one hang must be one record. The marker is created exclusively; one that is older than `since`
    is an earlier start's, and is replaced. A marker already there is a peer's claim (or the
    supervisor's, which found the hang first): this rank dumps its stacks as a peer instead."""
    marker = logs / HANG_MARKER
    try:
        if marker.stat().st_mtime >= since:
            return False
        marker.unlink()
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
