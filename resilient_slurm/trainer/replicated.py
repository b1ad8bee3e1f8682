"""The built-in trainer across replica groups (cluster.replica_ft): what its step adds to a plain one.

Before each step, the quorum (`replica.engine`): which groups are live, and, for a group that is
behind, the state from a live one. This group then computes its share of the global batch
(`replica.plan.share`: its own micro-batches, and a missing group's dealt over the live ones). The
step's sums span the live groups (`trainer/step.py`); a step whose reductions failed is done again
under the next quorum, from the same data. The lowest live group writes the run's records.

The ledger gets a group's leave (from the lowest live group, at the first quorum without it), a
replacement's heal (what its rank 0 received) and its join (after its first committed step). The
first quorum of a start waits for every group, up to cluster.replica_timeout_s, so that a start
does not train short of a group only because that group's processes were slower to start.
"""

from __future__ import annotations

import logging
import os
import time

from resilient_slurm import ledger
from resilient_slurm.config import Config
from resilient_slurm.data.batches import Batch
from resilient_slurm.data.pipeline import Sampler
from resilient_slurm.files import stamp_seconds
from resilient_slurm.ledger import EventLog
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.replica import plan
from resilient_slurm.replica.engine import Quorum, QuorumFailed, Replicas, StateFns
from resilient_slurm.rundir import record
from resilient_slurm.session.distributed import Comm
from resilient_slurm.session.replica_place import ReplicaPlace
from resilient_slurm.session.session import Session

log = logging.getLogger("resilient_slurm")

WAIT_POLL_S = 0.1


def open_replicas(cfg: Config, comm: Comm, place: ReplicaPlace, state: StateFns) -> Replicas:
    """This rank's part in the replica groups' quorum (torchft), on the lighthouse its supervisor runs."""
    from resilient_slurm.replica.torchft_engine import TorchftReplicas

    lighthouse = RankLaunch.from_env(os.environ).lighthouse
    if not lighthouse:
        raise RuntimeError(f"cluster.replica_ft is on but {RankLaunch.variable('lighthouse')} is not set: start the "
                           f"run with python -m resilient_slurm.launch, whose supervisor runs the replica groups' "
                           f"lighthouse")
    c = cfg.cluster
    return TorchftReplicas(place, rank=comm.rank, world_size=comm.world_size, store_addr=comm.store_addr,
                           store_port=comm.store_port, lighthouse=lighthouse, backend=comm.backend,
                           replica_min=c.replica_min, timeout_s=c.replica_timeout_s,
                           collective_timeout_s=c.collective_timeout_s, state=state)


class ReplicaSteps:
    def __init__(self, cfg: Config, replicas: Replicas, session: Session, events: EventLog, rank: int,
                 group_dp: int, local_dp: int) -> None:
        """`group_dp`: data-parallel ranks in a group; `local_dp`: this rank's among them."""
        self.cfg, self.replicas, self.session, self.events = cfg, replicas, session, events
        self.place = replicas.place
        self.rank, self.group_dp, self.local_dp = rank, group_dp, local_dp
        self.live: tuple[int, ...] = ()
        self.first = True
        self.joined = not self.place.heal
        self.committed_at = time.time()
        started = record.process_started()
        self.started_at = stamp_seconds(started) if started else time.time()

    def quorum(self) -> Quorum:
        """This step's quorum; the ledger records who left, and this group's heal."""
        s = self.session
        # A quorum may take longer than a step; a replacement's first one takes its heal, work that
        # may hold the interpreter, so it is a phase of its own (monitor.heartbeats.WAITS).
        s.announce("heal" if self.first and self.place.heal else "quorum")
        q = self.replicas.quorum()
        if self.first:
            q = self._first(q)
        me = self.place.group
        changed = plan.change(self.live, q.live)
        s.leads = plan.leader(q.live) == me
        if s.leads and self.rank == 0 and self.live:
            for g in changed.left:
                self.events.emit(ledger.ReplicaLeave(group=g, live=list(q.live),
                                                     seconds=round(time.time() - self.committed_at, 3)), q.step)
                log.warning("replica group %d left; groups %s go on, taking its micro-batches", g, list(q.live))
        if q.heal is not None and self.rank == 0:
            h = q.heal
            self.events.emit(ledger.ReplicaHeal(group=me, source=h.source, seconds=h.seconds, bytes=h.bytes), q.step)
            log.info("replica group %d healed from group %d at step %d (%.2f s, %d bytes per rank)", me, h.source,
                         q.step, h.seconds, h.bytes)
        if self.first and not self.place.heal:
            s.resumed_at(q.step)
        self.live, self.first = q.live, False
        return q

    def _first(self, q: Quorum) -> Quorum:
        """A replacement needs a live group to heal from; a start waits for every group a while."""
        me, groups = self.place.group, self.place.groups
        if self.place.heal:
            refused = plan.heal_refusal(q.live, me)
            if refused:
                self.replicas.abandon(refused)
                raise QuorumFailed(refused)
            return q
        deadline = time.monotonic() + self.cfg.cluster.replica_timeout_s
        while len(q.live) < groups and time.monotonic() < deadline:
            self.replicas.abandon(f"waiting for every replica group to start ({len(q.live)} of {groups})")
            time.sleep(WAIT_POLL_S)
            q = self.replicas.quorum()
        return q

    def batch(self, sampler: Sampler, position: int) -> list[Batch]:
        """This rank's micro-batches of the global batch at `position`: its group's share."""
        work = plan.share(self.live, self.place.groups, sampler.accumulation)[self.place.group]
        rows: dict[int, list[Batch]] = {}
        for w in work:
            if w.source not in rows:
                rows[w.source] = sampler.batch_at(position, w.source * self.group_dp + self.local_dp)
        return [rows[w.source][w.micro] for w in work]

    def committed(self, step: int) -> None:
        """After a committed step: a replacement's first one is its join."""
        self.committed_at = time.time()
        if not self.joined:
            self.joined = True
            if self.rank == 0:
                self.events.emit(ledger.ReplicaJoin(group=self.place.group, live=list(self.live),
                                                    seconds=round(self.committed_at - self.started_at, 3)), step)
                log.info("replica group %d joined at step %d", self.place.group, step)

    @property
    def missing(self) -> int:
        """Groups this step was short of."""
        return self.place.groups - len(self.live)
