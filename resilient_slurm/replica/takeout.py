"""What a silent data corruption leaves on record, and how its node leaves the run.

The rank that writes the run's records (rank 0; of the lowest live replica group) writes the `sdc` event with its evidence. Each culprit's node then goes the way a node that
failed its health check (an Xid) goes (`supervise/health_watch.py`): a `node_unhealthy` event
(reason `sdc: ...`), the run's exclude list (cluster.exclude_file), `scontrol drain` when
health.drain. In a Slurm job with monitor.sdc.leave_node the step then stops at this boundary:
every rank saves the healed state, and the job's restart leaves the node out, on a spare or
through a requeue, exactly as after an Xid.
"""

from __future__ import annotations

import logging
import time

from resilient_slurm.config import Config
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import EventLog, NodeUnhealthy, Sdc
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.slurm import scontrol

log = logging.getLogger("resilient_slurm")


def record(cfg: Config, events: EventLog, writes: bool, stop: StopRequest, step: int, found: Sdc,
           leave: bool = True) -> None:
    """Every rank calls it with the same finding; the one that `writes` the run's records acts.
    `leave`: monitor.sdc.leave_node may stop the step (not across replica groups, where a stop
    would stop every group: the driver moves the culprit's group alone, on the `sdc` event)."""
    if not writes:
        return
    events.emit(found, step)
    if found.action != "healed":
        log.error("step %d: silent data corruption, undecided (%s); suspects %s; the attempt ends, to resume from "
                  "the newest checkpoint", step, found.reason, ", ".join(found.suspects))
        return
    where = ", ".join(f"rank {r} on {n}" for r, n in zip(found.ranks, found.nodes))
    log.error("step %d: silent data corruption on %s in %s (%s); healed from %s in %.3f s", step, where,
              ", ".join(found.tensors[:4]) + (" ..." if len(found.tensors) > 4 else ""), found.reason,
              found.source, found.heal_s or 0.0)
    h = cfg.health
    for node in dict.fromkeys(found.nodes):
        reason = f"sdc: {found.check} at step {step} ({found.reason})"
        events.emit(NodeUnhealthy(bad_node=node, action="drain", xid=None, reason=reason, notes=[]), step)
        if cfg.cluster.exclude_file:
            exclude_list.add(cfg.cluster.exclude_file, node, reason=reason, now=time.time(),
                             job_id=events.context.get("job_id"), ttl_s=h.exclude_ttl_h * 3600.0)
        if h.drain:
            ok, message = scontrol.drain_node(node, f"resilient_slurm: {reason}")
            if not ok:
                log.warning("could not drain %s: %s", node, message)
    if leave and cfg.cluster.kind == "slurm" and cfg.monitor.sdc.leave_node:
        stop.request(f"silent data corruption on {', '.join(dict.fromkeys(found.nodes))}: the job restarts without it")
