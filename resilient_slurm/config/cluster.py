"""`cluster.*`: where the run executes: this machine, or a Slurm allocation and its spares."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems


@dataclass
class ElasticConfig:
    min_nodes: int = 0
    """Fewest nodes a Slurm run continues on inside its allocation (1..cluster.nodes). When a node
    fails and no spare is left, the run goes on with fewer nodes, down to this many: the same
    global batch (more accumulation), the exact data order, the state resharded from the
    checkpoint; below it the job requeues itself without the failed nodes. Setting it (even to
    cluster.nodes, which never shrinks) puts the job's driver in charge of restarts, as
    cluster.spare_nodes does. 0: neither shrinking nor, without spare nodes, a driver."""


@dataclass
class ClusterConfig:
    kind: str = "local"
    """local: run on this machine without Slurm; slurm: submit a job through submitit."""
    ranks: int = 1
    """local: data-parallel ranks (processes); 2 or more use torch.distributed."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with GPUs, else gloo), gloo or nccl."""
    collective_timeout_s: float = 300.0
    """A collective that waits longer than this fails instead of hanging forever."""
    kill_grace_s: float = 30.0
    """local: after one rank exits abnormally, wait this long for the others, then kill them."""
    # --- slurm
    partition: str | None = None
    """Slurm partition to submit to; null: the cluster's default."""
    nodes: int = 1
    """Nodes the training runs on."""
    spare_nodes: int = 0
    """Nodes allocated beyond `nodes` and kept idle: when a node of the run fails, the job's
    driver restarts training on a spare inside the same allocation (a new job step from the
    newest checkpoint; no trip through the queue). A node that failed is never used again in
    that allocation. With spares or elastic.min_nodes set, the job's batch script runs the driver
    (supervise/driver.py), which runs training as job steps."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    restart_in_process: bool = True
    """With the driver (spare nodes or elastic shrinking): when a rank's process dies and the others
    survive it, they restart in their own processes (no new interpreter, torch loaded, state from the
    memory tier) and only the lost ranks start anew, on a spare. A hang or a CUDA-class error
    restarts every process, as without it; so does a user's own loop (entry=)."""
    standby: bool = True
    """With restart_in_process and spare nodes: a warm process waits on each spare (its interpreter
    started, torch and the trainer imported), so a lost rank's replacement only joins and loads;
    without it, the replacement's process starts after the failure."""
    rejoin_timeout_s: float = 120.0
    """How long a surviving rank waits for the driver's word before it exits as any failed rank does."""
    replica_ft: bool = False
    """Per-step fault tolerance across the HSDP replica groups (parallel.dp_replicate >= 2): each group
    is a process group of its own, a quorum of the live groups is formed before every step, and the
    gradients are summed over those groups only. A failure stops only its group: the others finish
    the step without it, taking its micro-batches as extra accumulation (the global batch and the
    data stay the same), and the lost group is replaced (on a spare with Slurm) and heals from a
    live group over the network. Needs the built-in trainer."""
    replica_min: int = 1
    """Fewest live replica groups the run trains on; below it every process restarts (from the
    newest checkpoint), as without replica_ft."""
    spare_topup: int = 0
    """With replica_ft in a Slurm job: whenever spare_topup_at usable spares or fewer are left (by
    default none), the job's driver asks Slurm for this many more in a job of their own (the same
    partition, account, QOS and constraint, the job's own nodes and spares excluded, the time the
    job has left). Once that job runs, its nodes are spares: a lost replica group starts there as a
    step of that job, heals from a live group and joins, and a group that stayed out for want of a
    spare joins at once. So the run holds few spares and does not requeue when they run out. A
    restart of every group gives them back (the job is cancelled), and so does the end of the run.
    0: off."""
    spare_topup_at: int = 0
    """With spare_topup: the usable spares left at which the driver asks for more. 0 asks once none
    is left; with a long queue, ask earlier, at about the nodes the run loses while a job waits
    (one node an hour or so at 10,000 GPUs), so that a lost group does not wait out for hours."""
    replica_timeout_s: float = 30.0
    """How long the live groups wait for a group that is still alive but late (a hang, a straggler)
    at the quorum or in the cross-group reduction before they go on without it. A group whose
    processes died is left after a few seconds (its heartbeat stops), whatever this says."""
    tasks_per_node: int = 1
    """One task per rank: with GPUs, set it to gpus_per_node."""
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    time_min: int = 60
    """Wall-time limit of each allocation; the job requeues itself before it and continues."""
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    signal: str = "USR1"
    """Signal Slurm sends `signal_lead_s` before the time limit (and at preemption): USR1 or USR2.
    Not TERM: Slurm's scancel and preemption send TERM too, and a job cannot tell them apart."""
    signal_lead_s: int = 360
    """Lead time of the warning signal; Slurm delivers it up to 60 s earlier than asked. Must be above
    cluster.collective_timeout_s: a collective stuck when the warning comes must time out, and the
    ranks agree on their emergency save, before the job is killed."""
    term_grace_s: float = 30.0
    """Seconds from SIGTERM to SIGKILL: the partition's GraceTime on preemption, KillWait (30 s by
    default) on scancel. Bounds the emergency save after a SIGTERM."""
    max_restarts: int = 3
    """Requeues allowed after failures that made no progress; preemptions and time limits are free."""
    exclude_file: str | None = None
    """Exclude list (tools/xid_scan exclude ...): its active nodes are passed as --exclude."""
    sbatch_extra: dict[str, str] = field(default_factory=dict)
    """Extra sbatch options, e.g. {reservation: big, exclusive: ""}."""
    srun_extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the batch script before srun (module load, activate an environment)."""
    wait: bool = False
    """Block until the job finishes (otherwise print the job id and return)."""
    submit: bool = True
    """false: only prepare the run directory and print it; sbatch/train.sbatch runs the tasks itself."""

    def problems(self) -> list[str]:
        p, k = Problems(), self
        p.need(k.kind in ("local", "slurm"), f"cluster.kind: {k.kind!r} unknown; use cluster=local or cluster=slurm")
        p.need(k.ranks >= 1, f"cluster.ranks: {k.ranks}; set it to 1 or more")
        p.need(k.nodes >= 1 and k.tasks_per_node >= 1,
               f"cluster.nodes: {k.nodes}, cluster.tasks_per_node: {k.tasks_per_node}; set both to 1 or more")
        p.need(k.time_min >= 1, f"cluster.time_min: {k.time_min}; Slurm time limits are whole minutes >= 1")
        p.need(k.signal != "TERM", "cluster.signal: TERM cannot be the time-limit warning: scancel and preemption "
                                   "send TERM too and a job cannot tell them apart, so it would never requeue itself; "
                                   "use USR1 or USR2")
        p.need(k.signal in ("USR1", "USR2", "TERM"), f"cluster.signal: {k.signal!r}; use USR1 or USR2")
        p.need(0 < k.signal_lead_s < k.time_min * 60,
               f"cluster.signal_lead_s: {k.signal_lead_s}; set it above 0 and below cluster.time_min*60")
        p.need(k.max_restarts >= 0, f"cluster.max_restarts: {k.max_restarts}; set it >= 0")
        p.need(k.spare_nodes >= 0, f"cluster.spare_nodes: {k.spare_nodes}; set it >= 0")
        p.need(0 <= k.elastic.min_nodes <= k.nodes,
               f"cluster.elastic.min_nodes: {k.elastic.min_nodes} is not between 1 and cluster.nodes={k.nodes}; "
               f"set it within that range (0 turns shrinking off)")
        p.need(not driven(k) or k.kind == "slurm",
               "cluster.spare_nodes: spare nodes and elastic.min_nodes need a Slurm allocation; add cluster=slurm "
               "or set cluster.spare_nodes=0 cluster.elastic.min_nodes=0")
        p.need(k.term_grace_s > 0,
               f"cluster.term_grace_s: {k.term_grace_s}; set it > 0 (the partition's GraceTime, or KillWait)")
        p.need(k.gpus_per_node >= 0, f"cluster.gpus_per_node: {k.gpus_per_node}; set it >= 0")
        p.need(k.backend in ("auto", "gloo", "nccl"), f"cluster.backend: {k.backend!r}; use auto, gloo or nccl")
        p.need(k.collective_timeout_s > 0, f"cluster.collective_timeout_s: {k.collective_timeout_s}; set it > 0")
        p.need(k.replica_min >= 1, f"cluster.replica_min: {k.replica_min}; set it to 1 or more")
        p.need(k.spare_topup >= 0, f"cluster.spare_topup: {k.spare_topup}; set it >= 0 (0 turns it off)")
        p.need(not k.spare_topup or (k.replica_ft and k.kind == "slurm"),
               "cluster.spare_topup: only a replica group can start on the nodes of another Slurm job; set "
               "cluster=slurm cluster.replica_ft=true, or cluster.spare_topup=0")
        p.need(k.spare_topup_at >= 0, f"cluster.spare_topup_at: {k.spare_topup_at}; set it >= 0 (0 asks once "
                                      f"no spare is left)")
        p.need(not k.spare_topup_at or k.spare_topup > 0,
               f"cluster.spare_topup_at: {k.spare_topup_at} without top-ups; set cluster.spare_topup to the nodes "
               f"to ask for, or cluster.spare_topup_at=0")
        p.need(k.replica_timeout_s > 0, f"cluster.replica_timeout_s: {k.replica_timeout_s}; set it > 0")
        p.need(not (k.replica_ft and k.elastic.min_nodes),
               "cluster.replica_ft: a run with replica groups does not shrink (cluster.elastic.min_nodes): a lost "
               "group is replaced, or the run trains on without it; set cluster.elastic.min_nodes=0")
        return p


def world_size(cluster: ClusterConfig) -> int:
    """Ranks a run of this config has."""
    return cluster.ranks if cluster.kind == "local" else cluster.nodes * cluster.tasks_per_node


def min_nodes(cluster: ClusterConfig) -> int:
    """Fewest nodes the run may continue on inside its allocation."""
    return cluster.elastic.min_nodes or cluster.nodes


def driven(cluster: ClusterConfig) -> bool:
    """The job's driver runs training as job steps and restarts it inside the allocation (with
    replica groups: one job step per group)."""
    return cluster.spare_nodes > 0 or cluster.elastic.min_nodes > 0 or (cluster.replica_ft and cluster.kind == "slurm")
