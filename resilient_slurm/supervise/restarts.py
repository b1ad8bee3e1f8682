"""A restart inside the allocation, recorded once its new start took its first step: what it cost,
part by part, from the failure to that step.

    detect         the failure (srun's first report, a silent heartbeat) to the driver's decision
    teardown       a step restart: the decision to the old processes gone; in process: the survivors'
                   own teardown (their trainer and process group), which overlaps the decision
    placement      the decision to the new processes launched (or the survivors told where to meet)
    process_start  the launch to the new start's record less the rendezvous: srun, the interpreter,
                   the imports and the model built (in process: the replacements' and the rebuild)
    rendezvous     the longest any rank took to join the new process group
    load           the resume's load, and where from (`load_source`: memory, buddy, hot, cold)
    data_ready     the data opened (its cache or order files mapped)
    first_step     the resume to the first step written
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resilient_slurm import recovery
from resilient_slurm.files import stamp_seconds, utc_stamp
from resilient_slurm.ledger import DataReady, EventLog, PeerLost, RestartInAllocation, Resume, Start, read_events
from resilient_slurm.rundir import RunDir
from resilient_slurm.supervise.conclusion import PendingRestart


def record_restart(run_dir: Path, r: PendingRestart, events: EventLog, step_id: int | None,
                   first_step_at: float | None) -> None:
    history = read_events(RunDir(run_dir).events)
    key = (events.context["job_id"], events.context["restart"], step_id)
    mine = [e for e in history if recovery.attempt_key(e) == key]
    start = next((e.details for e in mine if isinstance(e.details, Start)), None)
    new_processes = _new_process_starts(r, start)
    # A standby's process began before the failure: none had to start after it.
    process_s = max(max(new_processes) - r.failed_at, 0.0) if new_processes else None
    events.emit(RestartInAllocation(
        cause=r.cause, placement=r.placement, replaced=list(r.replaced), added=list(r.added),
        latency_s=None if first_step_at is None else round(first_step_at - r.failed_at, 3), move=r.move,
        nodes=list(r.nodes) or None, failed_at=utc_stamp(r.failed_at), process_s=None if process_s is None else round(process_s, 3),
        path=r.path, why=r.why or None, breakdown=breakdown(r, history, mine, first_step_at)), r.last_step)


def breakdown(r: PendingRestart, history: list[Any], mine: list[Any], first_step_at: float | None) -> dict[str, Any]:
    """The parts of one restart, in seconds (None where the ledger does not show them)."""
    start = next((e.details for e in mine if isinstance(e.details, Start)), None)
    resume = next((e for e in mine if isinstance(e.details, Resume)), None)
    ready = next((e.details for e in mine if isinstance(e.details, DataReady)), None)
    decided = r.decided_at or r.failed_at
    placed = r.placed_at or decided
    if r.path == "inprocess":
        # The survivors of this restart recorded the newest generation they waited to join.
        lost = [e.details for e in history if isinstance(e.details, PeerLost)]
        newest = max((d.generation for d in lost), default=None)
        teardown = max((d.teardown_s for d in lost if d.generation == newest), default=None)
    else:
        teardown = r.ended_at - decided if r.ended_at else None
    # The new start's record is written once every rank met and the model is built: less the
    # rendezvous, the time from the launch to it is srun, the interpreter, the imports and the build.
    start_at = next((stamp_seconds(e.time) for e in mine if isinstance(e.details, Start)), None)
    met = start_at - (start.rendezvous_s or 0.0) if start is not None and start_at is not None else None
    parts = {
        "detect": decided - r.failed_at,
        "teardown": teardown,
        "placement": placed - (r.ended_at if r.path == "step" and r.ended_at else decided),
        "process_start": met - placed if met is not None else None,
        "rendezvous": start.rendezvous_s if start is not None else None,
        "load": resume.details.seconds if resume is not None else None,
        "data_ready": ready.seconds if ready is not None else None,
        "first_step": first_step_at - stamp_seconds(resume.time) if resume is not None and first_step_at else None,
    }
    out: dict[str, Any] = {k: None if v is None else round(max(v, 0.0), 3) for k, v in parts.items()}
    out["load_source"] = resume.details.source if resume is not None else None
    return out


def _new_process_starts(r: PendingRestart, start: Start | None) -> list[float]:
    """When the new start's new processes began: every rank's after a step restart, only the
    replacements' after a restart inside the surviving processes."""
    if start is None:
        return []
    if not start.process_starts:
        return [stamp_seconds(start.process_started)] if start.process_started and not r.replacements else []
    ranks = r.replacements or tuple(range(len(start.process_starts)))
    return [stamp_seconds(s) for i, s in enumerate(start.process_starts) if s and i in ranks]
