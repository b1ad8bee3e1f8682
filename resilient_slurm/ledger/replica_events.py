"""Replica groups (cluster.replica_ft): a group leaves the quorum, a replacement heals from a live
group and joins it, or going on without a group is refused. [pure]

A group's leave and join are not attempts of the run: its other groups never stopped, so the
attempt goes on (the goodput report counts their steps as productive, the steps short of a group
as degraded too)."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.ledger.kinds import Details, Kind


@dataclass(frozen=True, kw_only=True)
class ReplicaLeave(Details):
    """The live groups went on without `group` (written by the lowest live group's rank 0, at the
    first quorum without it)."""

    KIND = Kind.REPLICA_LEAVE
    group: int
    live: list[int]
    """The groups that went on."""
    seconds: float
    """The survivors' stall: from their last committed step's end to the quorum without the group
    (the step it failed in, and the wait for the lighthouse to drop it)."""


@dataclass(frozen=True, kw_only=True)
class ReplicaHeal(Details):
    """A group took the whole training state from a live one over the network (its rank 0: what that
    rank received; every rank of the group received its own shards)."""

    KIND = Kind.REPLICA_HEAL
    group: int
    source: int
    """The live group it healed from."""
    seconds: float
    """From the quorum's forming to the state installed: the transfer and the copy in."""
    bytes: int


@dataclass(frozen=True, kw_only=True)
class ReplicaJoin(Details):
    """A replacement group committed its first step with the others (its rank 0)."""

    KIND = Kind.REPLICA_JOIN
    group: int
    live: list[int]
    seconds: float
    """From its processes' start to that step's end: all the replacement cost the run's capacity."""


@dataclass(frozen=True, kw_only=True)
class ReplicaRefused(Details):
    """The run could not go on without the failed groups (the supervisor's one line): every process
    restarts, or the job requeues, as without replica groups."""

    KIND = Kind.REPLICA_REFUSED
    groups: list[int]
    """The groups that failed."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class SpareTopup(Details):
    """The driver asked Slurm for spare nodes in a job of their own (cluster.spare_topup), that job
    started and its nodes became spares, or the driver gave them back (`state`)."""

    KIND = Kind.SPARE_TOPUP
    state: str
    """asked, granted, refused (sbatch said no: `reason`), lost (the job ended by itself) or given back."""
    topup_job: str
    nodes: list[str]
    reason: str = ""
