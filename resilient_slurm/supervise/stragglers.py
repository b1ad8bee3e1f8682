"""What a monitor does about a straggler its heartbeats found (`monitor.stragglers`): a `straggler`
event under that rank and its node, with its scores, and a mark in the node record
(`health.node_record`), where a node found slow again and again is kept out of new jobs. Whether
the run swaps the node out is the driver's (`action`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from resilient_slurm.health import node_record
from resilient_slurm.ledger import EventLog
from resilient_slurm.ledger import Straggler as StragglerEvent
from resilient_slurm.monitor.stragglers import Straggler
from resilient_slurm.rundir import RunDir


def record_straggler(run_dir: Path, s: Straggler, node: str, context: dict[str, Any], action: str,
                     record_file: str | None = None, job_id: str | None = None, group: int | None = None) -> None:
    EventLog(RunDir(run_dir).events, rank=s.rank, context={**context, "node": node}).emit(StragglerEvent(
        ratio=s.ratio, compute_s=s.compute_s, others_s=s.others_s, steps=s.steps, sections=s.sections,
        scores={str(r): v for r, v in s.scores.items()}, action=action, group=group), s.step)
    if record_file:
        node_record.append(record_file, node_record.Mark(node=node, kind=node_record.STRAGGLER, at=time.time(),
                                                          job_id=job_id, detail={"ratio": s.ratio, "rank": s.rank,
                                                                                 "step": s.step}))
