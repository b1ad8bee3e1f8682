"""What a supervisor tells a rank it starts: one frozen record, and its one spelling as environment
variables. Pure.

The local launcher, a Slurm job's driver and its tasks build a `RankLaunch` and hand it on
explicitly: to a child process as `env=launch.to_env()` (never by changing their own environment for
the child to inherit), to srun as `--export` entries (`exports()`: Slurm gives each task its rank),
and to `runtime.rank.run(launch)`. A rank reads it back with `from_env`. This module is the only code
that names these variables: torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, which a user's own loop reads through `init_process_group()`) and the project's own
RESILIENT_SLURM_* ones.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields

_OURS = {
    "run_dir": "RESILIENT_SLURM_RUN_DIR",
    "heartbeat": "RESILIENT_SLURM_HEARTBEAT",
    "generation": "RESILIENT_SLURM_GENERATION",
    "driven": "RESILIENT_SLURM_DRIVEN",
    "rejoin": "RESILIENT_SLURM_REJOIN",
    "join": "RESILIENT_SLURM_JOIN",
    "standby": "RESILIENT_SLURM_STANDBY",
    "replica_group": "RESILIENT_SLURM_REPLICA_GROUP",
    "replica_heal": "RESILIENT_SLURM_REPLICA_HEAL",
    "lighthouse": "RESILIENT_SLURM_LIGHTHOUSE",
    "join_rank": "RESILIENT_SLURM_JOIN_RANK",
    "host_job": "RESILIENT_SLURM_HOST_JOB",
    "host_restart": "RESILIENT_SLURM_HOST_RESTART",
}
_TORCHRUN = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
}


@dataclass(frozen=True)
class RankLaunch:
    run_dir: str = ""
    """The run directory; a user's loop that makes its own `Session` finds it here."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 0
    """Ranks on this node (the CPU threads each rank takes are shared out by it); 0: the world size."""
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    heartbeat: str = ""
    """`host:port` of the monitor the rank beats to (the local launcher, the job's driver); empty: none."""
    generation: int = 0
    """Which start of the ranks the rank belongs to: a restart inside the processes begins a new one,
    and the monitor ignores beats of an older one."""
    driven: bool = False
    """A task of a step the job's driver runs: it records its outcome and decides nothing."""
    rejoin: bool = False
    """A survivor of a peer's death waits for the driver's word to go on in its process."""
    join: int | None = None
    """A replacement step's task: the generation it joins."""
    standby: bool = False
    """A standby on a spare: it makes itself ready, then waits to be woken into a generation."""
    replica_group: int | None = None
    """With cluster.replica_ft: the replica group whose ranks alone make this rank's process group
    (`rank` and `world_size` are then the group's); None: no replica groups."""
    replica_heal: bool = False
    """The rank replaces a lost replica group: it takes the state from a live group over the
    network at its first quorum, and never reads a checkpoint."""
    lighthouse: str = ""
    """`host:port` of the replica groups' quorum server (the local launcher's or the driver's)."""
    join_rank: int | None = None
    """A replacement's rank in the world it joins, when the driver knows it at the start (a step of
    another job cannot be looked up by its step id in the driver's word)."""
    host_job: str = ""
    """The run's own Slurm job, for a task that runs in a job lending the run its nodes (a spare
    top-up, cluster.spare_topup): it records and reads as a task of that job; empty: its own job."""
    host_restart: int = 0
    """That job's restart count (SLURM_RESTART_COUNT there)."""

    def to_env(self) -> dict[str, str]:
        """Every field as an environment variable (for a child process: `env={**os.environ, **this}`)."""
        out = {_TORCHRUN[k]: str(getattr(self, k)) for k in _TORCHRUN}
        out[_TORCHRUN["local_world_size"]] = str(self.local_world_size or self.world_size)
        return {**out, **dict(self._ours())}

    def exports(self) -> tuple[str, ...]:
        """The project's own variables as srun `--export` entries; the rank comes from Slurm, the run
        directory from the task's command line (a path may hold a comma, which --export cannot
        carry). Every other one is spelled, so that nothing the supervisor's own environment holds
        leaks into the task."""
        return tuple(f"{k}={v}" for k, v in self._ours() if k != _OURS["run_dir"])

    def _ours(self) -> list[tuple[str, str]]:
        values = {"driven": "1" if self.driven else "0", "rejoin": "1" if self.rejoin else "0",
                  "standby": "1" if self.standby else "0", "join": "" if self.join is None else str(self.join),
                  "replica_heal": "1" if self.replica_heal else "0",
                  "join_rank": "" if self.join_rank is None else str(self.join_rank),
                  "replica_group": "" if self.replica_group is None else str(self.replica_group)}
        return [(name, values.get(k, str(getattr(self, k)))) for k, name in _OURS.items()]

    @staticmethod
    def from_env(env: Mapping[str, str]) -> RankLaunch:
        """What `to_env` wrote (absent variables take the defaults: a process nobody supervises)."""
        raw = {k: env[name] for k, name in {**_TORCHRUN, **_OURS}.items() if env.get(name, "") != ""}
        kinds = {f.name: f.type for f in fields(RankLaunch)}
        out: dict[str, object] = {}
        for k, value in raw.items():
            kind = str(kinds[k])
            if kind == "bool":
                out[k] = value == "1"
            elif kind.startswith("int"):
                out[k] = int(value)
            else:
                out[k] = value
        return RankLaunch(**out)  # type: ignore[arg-type]

    @staticmethod
    def variable(name: str) -> str:
        """The environment variable of field `name` (for messages that tell a user what to set)."""
        return {**_TORCHRUN, **_OURS}[name]

    @staticmethod
    def names() -> tuple[str, ...]:
        """Every variable this record spells: what makes a process a rank of the run."""
        return (*_TORCHRUN.values(), *_OURS.values())


def mark_generation(env: MutableMapping[str, str], generation: int) -> None:
    """A rank that joined a new generation (a replacement, a woken standby, a survivor restarting in
    its process) says so in its own environment, where its next heartbeat reads it (`from_env`)."""
    env[_OURS["generation"]] = str(generation)
