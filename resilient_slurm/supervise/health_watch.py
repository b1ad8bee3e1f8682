"""The job side of node health: check the node before training and every `check_every_s` during it.

For users who cannot install cluster-wide Prolog/Epilog hooks, and between them for those who
can: an Xid that takes a GPU off the bus mid-job should not wait for the Epilog. One checker per
node (the task with local rank 0) runs `health.scan.preflight` (the same scan as
`tools/xid_scan`); a node that must go out is recorded in the ledger, put on the exclude list,
drained when allowed, marked in the node record (`health.node_record`), and the job is asked to
stop: every rank then saves the same step, and the job requeues itself without the node
(recovery.decide reads the `node_unhealthy` event).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.health import exclude_list, node_record
from resilient_slurm.health.scan import preflight
from resilient_slurm.ledger import EventLog, NodeUnhealthy
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.slurm import scontrol

log = logging.getLogger("resilient_slurm")


class NodeHealthWatch:
    def __init__(self, cfg: Config, run_dir: Path, node: str, job_id: str, events: EventLog) -> None:
        self.cfg = cfg
        self.state_dir = str(run_dir / "health")
        self.node = node
        self.job_id = job_id
        self.events = events
        self._stop = threading.Event()

    def check(self) -> str | None:
        """Scan now; None when the node stays, else the reason it must go (already acted on)."""
        h = self.cfg.health
        expect = h.expect_gpus if h.expect_gpus is not None else (self.cfg.cluster.gpus_per_node or None)
        report = preflight(
            state_dir=self.state_dir, expected_gpus=expect, timeout_s=h.timeout_s,
            kernel_log=h.kernel_log.replace("%n", self.node) if h.kernel_log else None,
        )
        verdict = report.verdict
        if verdict.ok:
            return None
        reason = f"node {self.node}: {verdict.reason}"
        self.events.emit(NodeUnhealthy(bad_node=self.node, action=verdict.action.label, xid=verdict.xid,
                                       reason=verdict.reason, notes=list(report.notes)), None)
        log.error("node health check failed: %s", reason)
        if self.cfg.cluster.exclude_file:
            exclude_list.add(self.cfg.cluster.exclude_file, self.node, reason=verdict.reason, now=time.time(),
                             xid=verdict.xid, job_id=self.job_id, ttl_s=h.exclude_ttl_h * 3600.0)
        if h.node_record:
            node_record.append(h.node_record, node_record.Mark(
                self.node, node_record.XID, time.time(), self.job_id,
                {"xid": verdict.xid, "action": verdict.action.label, "reason": verdict.reason}))
        if h.drain:
            ok, message = scontrol.drain_node(self.node, f"resilient_slurm: {verdict.reason}")
            if not ok:
                log.warning("could not drain %s: %s", self.node, message)
        return reason

    def start(self, stop: StopRequest) -> None:
        """Check every `check_every_s` in a daemon thread; a failing node asks the job to stop."""
        if not self.cfg.health.check_every_s:
            return

        def loop() -> None:
            while not self._stop.wait(self.cfg.health.check_every_s):
                reason = self.check()
                if reason:
                    stop.request(reason)
                    return

        threading.Thread(target=loop, name="node-health", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
