"""What a monitor does about the ranks its heartbeats found hung, before it ends the step: every live
rank's stacks (and flight-recorder entries) on record, a hung one's too where this machine can read
it, and a `hang` event under each culprit rank and its node, naming whom the others wait for, so the
usual decision (`recovery.decide`) sees a hang there and the report names it. The culprits' nodes go
to the node record (`health.node_record`), where a node that keeps hanging jobs is kept out of the
next ones.

The live ranks dump their own: their hang watchdogs (session/watchdog.py) poll the marker file in
the run's logs and dump within a fraction of a second; the monitor waits for their files (at most
`PEER_DUMP_GRACE_S`). A stopped or deadlocked rank cannot run code; py-spy (the `stacks` extra)
reads it from outside when it runs on this machine.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from resilient_slurm.health import node_record
from resilient_slurm.ledger import EventLog, Hang
from resilient_slurm.monitor.heartbeats import Silence, Wavefront
from resilient_slurm.rundir import RunDir
from resilient_slurm.monitor.hang_dumps import HANG_MARKER, PEER_DUMP_GRACE_S, PY_SPY_TIMEOUT_S

POLL_S = 0.05


def record_hang(run_dir: Path, hung: list[Silence], front: Wavefront | None, live: Iterable[int],
                nodes: Mapping[int, str], pids: Mapping[int, int], context: Mapping[int, dict[str, Any]],
                record_file: str | None = None, job_id: str | None = None) -> list[Path]:
    """Stacks, then one `hang` event per culprit in `hung` (written as that rank, on its node), each
    naming every culprit, their nodes and the collective the others wait in; returns the dumps.
    `live`: the ranks whose watchdogs are asked to dump; `pids`: culprits py-spy can read here."""
    logs = RunDir(run_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    marked_at = time.time()
    (logs / HANG_MARKER).touch()
    culprits = [s.rank for s in hung]
    who = front.describe(nodes) if front is not None else "; ".join(s.describe() for s in hung)
    dumps = []
    for s in hung:
        dump = logs / f"hang-rank{s.rank}-heartbeat.txt"
        with open(dump, "w") as f:
            f.write(f"rank {s.rank}: {s.describe()} (found by the heartbeat monitor)\n{who}\n")
        if s.rank in pids:
            _py_spy(pids[s.rank], dump)
        dumps.append(dump)
    _await_peer_dumps(logs, [r for r in live if r not in culprits], marked_at)
    culprit_nodes = list(dict.fromkeys(nodes[r] for r in culprits if r in nodes))
    for s, dump in zip(hung, dumps):
        reason = f"heartbeat: {s.describe()}" + (f"; {front.describe(nodes)}" if front is not None else "")
        EventLog(RunDir(run_dir).events, rank=s.rank, context=dict(context.get(s.rank, {}))).emit(
            Hang(reason=reason, waited_s=round(s.silent_s, 1), limit_s=round(s.limit_s, 1), stacks=str(dump),
                 culprits=culprits, nodes=culprit_nodes or None,
                 collective=front.as_record() if front is not None else None), s.step)
    if record_file:
        for node in culprit_nodes:
            node_record.append(record_file, node_record.Mark(node=node, kind=node_record.HANG, at=time.time(),
                                                              job_id=job_id, detail={"reason": who[:300]}))
    return dumps


def _py_spy(pid: int, dump: Path) -> None:
    py_spy = shutil.which("py-spy")
    if not py_spy:
        return
    try:
        # --nonblocking: a stopped process cannot be paused again, it is read as it is.
        out = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=PY_SPY_TIMEOUT_S)
        with open(dump, "a") as f:
            f.write("\n--- py-spy dump ---\n" + out.stdout + out.stderr)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _await_peer_dumps(logs: Path, ranks: list[int], since: float) -> None:
    """Until each of `ranks` dumped its stacks after `since` (its watchdog saw the marker), or the grace ends."""
    deadline = time.monotonic() + PEER_DUMP_GRACE_S
    waiting = set(ranks)
    while waiting and time.monotonic() < deadline:
        for rank in list(waiting):
            if any(p.stat().st_mtime >= since - 1.0 for p in logs.glob(f"hang-rank{rank}-step*.txt")):
                waiting.discard(rank)
        time.sleep(POLL_S)
