"""Where a rank sits among the replica groups (cluster.replica_ft), as its supervisor told it. [pure]

Below the replica groups' own package (`replica/`) because the rank's process group carries it
(`distributed.RankInfo.replica`): every HSDP replica group is a process group of its own, and
`rank` and `world_size` are then the group's.
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.process.launch import RankLaunch


@dataclass(frozen=True)
class ReplicaPlace:
    group: int
    groups: int
    """parallel.dp_replicate."""
    group_size: int
    """Ranks per group (dp_shard * tp)."""
    heal: bool = False
    """This group's processes replace a lost group: they take the state from a live group over the
    network at their first quorum, and never read a checkpoint."""

    def global_rank(self, local: int) -> int:
        return self.group * self.group_size + local


def place_from_launch(launch: RankLaunch, groups: int, group_size: int) -> ReplicaPlace:
    """The place the supervisor gave this rank."""
    if launch.replica_group is None:
        raise ValueError(f"cluster.replica_ft is on but {RankLaunch.variable('replica_group')} is not set: start the "
                         f"run with python -m resilient_slurm.launch, which starts each replica group")
    return ReplicaPlace(launch.replica_group, groups, group_size, heal=launch.replica_heal)
