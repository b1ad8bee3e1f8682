"""What a monitor does about a rank its heartbeats found silent, before it ends the step: every live
rank's stacks on record, the silent one's too where this machine can read it, and a `hang` event
under the silent rank and its node, so the usual decision (`recovery.decide`) sees a hang there.

The live ranks dump their own stacks: their hang watchdogs (runtime/watchdog.py) poll the marker
file in the run's logs and dump within a second. A stopped or deadlocked rank cannot run code; py-spy
(the `stacks` extra) reads it from outside when it runs on this machine.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from resilient_slurm.ledger import EventLog, Hang
from resilient_slurm.monitor.heartbeats import Silence
from resilient_slurm.rundir import RunDir
from resilient_slurm.session.watchdog import HANG_MARKER, PEER_DUMP_GRACE_S, PY_SPY_TIMEOUT_S


def record_silence(run_dir: Path, silence: Silence, pid: int | None, context: dict[str, Any]) -> Path:
    """Stacks, then the `hang` event (written as the silent rank, on its node); returns the dump."""
    logs = RunDir(run_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    (logs / HANG_MARKER).touch()
    dump = logs / f"hang-rank{silence.rank}-heartbeat.txt"
    with open(dump, "w") as f:
        f.write(f"rank {silence.rank}: {silence.describe()} (found by the heartbeat monitor)\n")
    py_spy = shutil.which("py-spy")
    if pid is not None and py_spy:
        try:
            # --nonblocking: a stopped process cannot be paused again, it is read as it is.
            out = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                                 text=True, timeout=PY_SPY_TIMEOUT_S)
            with open(dump, "a") as f:
                f.write("\n--- py-spy dump ---\n" + out.stdout + out.stderr)
        except (OSError, subprocess.TimeoutExpired):
            pass
    time.sleep(PEER_DUMP_GRACE_S)  # the live ranks' watchdogs dump theirs meanwhile
    EventLog(RunDir(run_dir).events, rank=silence.rank, context=context).emit(
        Hang(reason=f"heartbeat: {silence.describe()}", waited_s=round(silence.silent_s, 1),
             limit_s=round(silence.limit_s, 1), stacks=str(dump)), silence.step)
    return dump
