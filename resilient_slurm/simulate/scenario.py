"""The simulated run's inputs and the strategies compared. Pure.

Defaults are the seed's scenario: 10,000 GPUs for 30 days at a per-GPU MTBF of 10,000 h. Inputs
the project already configures (restart budget, Young-Daly prior and bounds, collective timeout,
exclude-list TTL, warning lead) take their defaults from `resilient_slurm.config`, so the
simulation runs the project's settings unless told otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resilient_slurm.config import CheckpointConfig, ClusterConfig, HealthConfig, MonitorConfig
from resilient_slurm.simulate.bench import BENCH_KEYS, from_bench  # noqa: F401  (their home before issue 23)
from resilient_slurm.simulate import published
from resilient_slurm.simulate.failures import FAULTS, Fault


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    saves: str
    """none | fixed (every `interval_min`) | young_daly (`checkpoint.interval`, learned as the run goes)"""
    async_saves: bool
    """Training blocks for `blocking_s` per save instead of the whole `save_s`."""
    in_allocation: bool
    """Spare nodes; restarts inside the allocation (`slurm.placement`), from buddy copies."""
    elastic: bool
    """Without spares, continue on fewer nodes down to `min_nodes`."""
    heartbeat: bool = False
    """A hang is found after `heartbeat_s` (a silent rank), not at the collective timeout."""
    memory: bool = False
    """A memory tier (`memory.py`): restarts inside the allocation load from host memory."""
    in_process: bool = False
    """The survivors restart in their own processes, unless the fault forbids it."""
    replica_ft: bool = False
    """Per-step fault tolerance across replica groups: a failure stops only its group, which heals
    from a live one while the others train on, short a group (`partial.py`)."""
    stragglers: bool = False
    """A slow node is found after `straggler_detect_s` and swapped out at a step boundary (its
    group leaves and heals on a spare); otherwise an episode lasts its whole length."""
    sentinel: bool = False
    """The SDC sentinel: replicas compare weight fingerprints every step; the culprit's group heals
    from a good one. Otherwise a silent corruption is found `sdc_found_after_h` later."""
    topup: bool = False
    """Spare top-ups (cluster.spare_topup): whenever no usable spare is left, `topup_nodes` more are
    asked for in a job of their own and arrive after a queue wait; a group that lost a node with no
    spare waits out for them, instead of the whole run requeueing (`partial.py`)."""


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("none", "no checkpoints; requeue on every failure", "none", False, False, False),
    Strategy("fixed", "fixed interval, sync saves; requeue (the seed's recipe)", "fixed", False, False, False),
    Strategy("young_daly", "Young-Daly interval, sync saves; requeue", "young_daly", False, False, False),
    Strategy("async", "+ async saves", "young_daly", True, False, False),
    Strategy("spares", "+ spare nodes: restart inside the allocation", "young_daly", True, True, False),
    Strategy("elastic", "+ elastic: shrink when no spare is left", "young_daly", True, True, True),
    Strategy("heartbeat", "spares + heartbeats: a silent rank is a hang after heartbeat_s", "young_daly", True, True,
             False, heartbeat=True),
    Strategy("memory", "+ a memory tier: saves to host memory, loads from the node's or its buddy's", "young_daly",
             True, True, False, heartbeat=True, memory=True),
    Strategy("inprocess", "+ restart inside the surviving processes (a step restart after a hang or a CUDA error)",
             "young_daly", True, True, False, heartbeat=True, memory=True, in_process=True),
    Strategy("replica_ft", "+ per-step fault tolerance: a failure stops only its replica group, which heals from a "
             "live one", "young_daly", True, True, False, heartbeat=True, memory=True, in_process=True, replica_ft=True),
    Strategy("stragglers", "+ slow nodes found and swapped out at a step boundary", "young_daly", True, True, False,
             heartbeat=True, memory=True, in_process=True, replica_ft=True, stragglers=True),
    Strategy("sdc", "+ the SDC sentinel: replicas compare weight fingerprints every step", "young_daly", True, True,
             False, heartbeat=True, memory=True, in_process=True, replica_ft=True, stragglers=True, sentinel=True),
    Strategy("topup", "+ spare top-ups: no spare left, more are asked for in a job of their own; a lost group "
             "waits out for them", "young_daly", True, True, False, heartbeat=True, memory=True, in_process=True,
             replica_ft=True, stragglers=True, sentinel=True, topup=True),
)}
STEPS = ("spares", "heartbeat", "memory", "inprocess", "replica_ft", "stragglers", "sdc", "topup")
"""Issue 23's and issue 28's mechanisms one at a time, each on top of the one before (`--losses`)."""


@dataclass(frozen=True)
class Scenario:
    gpus: int = 10_000
    gpus_per_node: int = 8
    days: float = 30.0
    gpu_mtbf_h: float = 10_000.0
    """Hours of training between new failures of one GPU, every cause counted (`failures.FAULTS`
    splits them); bad nodes and code bugs that strike again come on top."""
    save_s: float = 30.0
    """A checkpoint save from start to committed; a synchronous save blocks training this long."""
    blocking_s: float = 2.0
    """Async saves: training time a save costs (copy to host, plus the slowdown while it writes)."""
    load_s: float = 60.0
    """Resume from the hot tier (node-local copies, or a buddy's)."""
    cold_load_s: float = 300.0
    """Resume from the cold tier, when a node's hot copy is gone and it has no buddy copy."""
    cold_copy_s: float = 300.0
    """A committed checkpoint reaches the cold tier this long after its commit."""
    restart_s: float = 120.0
    """A requeued job: process start to first step (launch, imports, NCCL init), load excluded."""
    in_alloc_restart_s: float = 30.0
    """A restart inside the allocation: a new job step on the survivors, load excluded."""
    queue_min_s: float = 120.0
    queue_max_s: float = 600.0
    """A requeued job waits for its nodes this long (uniform): the seed's "2-10 minutes"."""
    cred_delay_s: float = 121.0
    """Slurm holds a requeued job this long before it may start (AuthInfo cred_expire 120 s + 1)."""
    backfill_s: float = 30.0
    """Then it starts at the next scheduler pass (bf_interval; uniform wait up to this)."""
    hang_detect_s: float = ClusterConfig.collective_timeout_s
    """A hang is found when the collective times out."""
    reset_s: float = 600.0
    """A node out for a GPU reset is healthy again after this long."""
    manual_h: float = 2.0
    """After the job gives up: hours until a person has fixed the cause and relaunched."""
    spares: int = 16
    """Spare nodes held in the allocation (strategies that restart inside it)."""
    topup_nodes: int = 2
    """Nodes per spare top-up job (cluster.spare_topup; strategy `topup`)."""
    topup_at: int = 0
    """A top-up is asked for once this many usable spares or fewer are left (cluster.spare_topup_at)."""
    min_nodes: int | None = None
    """Elastic floor in nodes; None: 98% of the nodes."""
    interval_min: float = 30.0
    """The fixed strategy's save interval (checkpoint.every_minutes)."""
    step_s: float = 10.0
    """One optimizer step on the whole allocation (steps name where failures happen)."""
    planned_per_day: float = 0.0
    """Planned stops (maintenance): a warning signal, an emergency save, a requeue."""
    price: float = 2.5
    price_low: float = 2.0
    price_high: float = 3.0
    """Dollars per GPU-hour: the figure used, and the seed's range."""
    ckpt_bytes: float = 4e9
    """Bytes each rank saves (only the emergency plan's arithmetic uses it)."""
    max_restarts: int = ClusterConfig.max_restarts
    mtbf_prior_h: float = CheckpointConfig.mtbf_prior_h
    min_interval_s: float = CheckpointConfig.min_interval_s
    max_interval_s: float = CheckpointConfig.max_interval_s
    exclude_ttl_h: float = HealthConfig.exclude_ttl_h
    signal_lead_s: float = ClusterConfig.signal_lead_s
    emergency_reserve_s: float = CheckpointConfig.emergency_reserve_s
    # --- issue 23: heartbeats, the memory tier, restarts inside the surviving processes
    heartbeat_s: float = MonitorConfig.heartbeat_timeout_s
    """Heartbeats: a rank silent this long is a hang (monitor.heartbeat_timeout_s: 6 s since issue 28;
    a SIGSTOPped rank was on record 5.2-5.5 s after the stop in the Slurm tests and bench/restart.py)."""
    crash_detect_s: float = 0.0
    """A crash: from the failure to the decision (a rank's process ends; its step fails)."""
    memory_every_steps: int = 0
    """Memory tier: save every N steps; 0: at the Young-Daly interval of its own cost (at least a step)."""
    memory_blocking_s: float = 2.0 / 3
    """A memory-tier save blocks training this long (the device→host copy)."""
    memory_save_s: float = 10.0
    """A memory-tier save until the own node's copy and the buddy's are committed."""
    memory_load_s: float = 2.0 / 3
    """Resume from the own node's memory tier."""
    buddy_load_s: float = 4.0 / 3
    """Resume from the buddy's memory tier (the ranks of a node that left the run)."""
    placement_s: float = 0.5
    """In-process restart: the driver decides the placement."""
    teardown_s: float = 11.5
    """In-process restart: the survivors leave the broken process group."""
    replacement_start_s: float = 5.0
    """In-process restart: the replacement's processes start, until they reach the rendezvous."""
    rendezvous_s: float = 0.5
    """In-process restart: every rank meets on the new store."""
    data_ready_s: float = 0.0
    """In-process restart: the data loader is at the resumed position."""
    first_step_s: float = 0.0
    """In-process restart: the first step's time beyond a steady step's."""
    cuda_error_in_process: bool = False
    """After a CUDA-class error whose node leaves the run (its processes with it), the survivors
    restart in their processes too. Issue 23 takes a step restart; True shows what trusting them buys."""
    # --- issue 28: communicator creation, replica groups, silent data corruption, stragglers
    comm_init_s: float | None = None
    """Creating the world's communicators, paid by every restart that starts the world anew (a
    requeue, a step restart, an in-process restart); None: `published.comm_init_s` at --gpus."""
    replica_groups: int = 10
    """HSDP replica groups (parallel.dp_replicate) of `replica_ft`; assumed: 10 groups of 1,000
    GPUs (each group holds the whole state, sharded over its GPUs)."""
    replica_min: int | None = None
    """Fewest live groups per-step fault tolerance trains on (cluster.replica_min); below it, the
    failure takes today's path. None: a majority (torchft's advice, against split brain)."""
    quorum_s: float = published.QUORUM_S
    """Every live GPU waits this long when a group leaves, and again when it joins."""
    heal_s: float | None = None
    """A new group receives the state from a live one, with no disk read; None: 1 s plus its share
    of the state (ckpt_bytes x replica_groups per GPU) at 50 GB/s."""
    degraded_overhead: float = 1.0
    """The survivors' step time short a group, over the ideal (R / (R - 1) x a step: the lost
    group's micro-batches are extra accumulation, the global batch stays the same)."""
    fingerprint_s: float = published.FINGERPRINT_S
    """The SDC sentinel's cost per step (a checksum of the shards, compared across replicas)."""
    sdc_gpu_mtbf_h: float = published.SDC_GPU_MTBF_H
    """Hours of one GPU between silent data corruptions (0: none)."""
    sdc_nan_share: float = published.SDC_NAN_SHARE
    """Share of them that end in NaN/Inf, which the NaN rollback catches at once."""
    sdc_found_after_h: float = published.SDC_FOUND_AFTER_H
    """Without the sentinel, a silent one is found this many hours later; the run rolls back to the
    newest checkpoint before it, loaded from the cold tier after a restart."""
    straggler_gpu_mtbf_h: float = published.STRAGGLER_GPU_MTBF_H
    """Hours of one GPU between fail-slow episodes (0: none)."""
    straggler_slowdown: float = published.STRAGGLER_SLOWDOWN
    """The whole job's step time while one lasts, over normal."""
    straggler_duration_h: float = published.STRAGGLER_DURATION_H
    """Mean length of an episode (exponential)."""
    straggler_detect_s: float = published.STRAGGLER_DETECT_S
    """With `stragglers`: from the episode's start to the slow node's swap."""
    faults: tuple[Fault, ...] = FAULTS

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def floor_nodes(self) -> int:
        return self.min_nodes if self.min_nodes is not None else max(1, math.ceil(0.98 * self.nodes))

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0

    @property
    def job_mtbf_s(self) -> float:
        return self.gpu_mtbf_h * 3600.0 / self.gpus

    def comm_init(self, ranks: int | None = None) -> float:
        """Creating a communicator over `ranks` (default: every GPU of the run)."""
        world = self.comm_init_s if self.comm_init_s is not None else published.comm_init_s(self.gpus)
        return world * (ranks if ranks is not None else self.gpus) / self.gpus

    @property
    def heal_seconds(self) -> float:
        return self.heal_s if self.heal_s is not None else \
            published.HEAL_FIXED_S + self.ckpt_bytes * self.replica_groups / published.NETWORK_BYTES_S

    @property
    def replica_floor(self) -> int:
        return self.replica_min if self.replica_min is not None else self.replica_groups // 2 + 1

    def value(self, name: str) -> float:
        """A cost as the run uses it (the derived ones where the field is None)."""
        derived = {"comm_init_s": self.comm_init(), "heal_s": self.heal_seconds}
        return derived[name] if getattr(self, name) is None else float(getattr(self, name))

    def validate(self) -> list[str]:
        """Every problem, one line each, naming the option and the fix."""
        p = []
        if self.gpus < 1 or self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            p.append(f"--gpus {self.gpus}: must be a positive multiple of --gpus-per-node {self.gpus_per_node}")
        for name in ("days", "gpu_mtbf_h", "save_s", "step_s", "interval_min", "manual_h"):
            if getattr(self, name) <= 0:
                p.append(f"--{name.replace('_', '-')}: must be > 0")
        for name in ("blocking_s", "load_s", "cold_load_s", "cold_copy_s", "restart_s", "in_alloc_restart_s",
                     "queue_min_s", "cred_delay_s", "backfill_s", "hang_detect_s", "reset_s", "planned_per_day",
                     *COSTS_23, "memory_every_steps", *COSTS_28):
            if self.value(name) < 0:
                p.append(f"--{name.replace('_', '-')}: must be >= 0")
        if self.blocking_s > self.save_s:
            p.append(f"--blocking-s {self.blocking_s:g}: an async save cannot block longer than --save-s {self.save_s:g}")
        if self.queue_max_s < self.queue_min_s:
            p.append("--queue-max-s: must be >= --queue-min-s")
        if self.spares < 0:
            p.append("--spares: must be >= 0")
        if self.topup_nodes < 1:
            p.append("--topup-nodes: must be >= 1")
        if self.topup_at < 0:
            p.append("--topup-at: must be >= 0")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            p.append(f"--min-nodes {self.min_nodes}: must be between 1 and the {self.nodes} nodes of the run")
        if self.cold_load_s < self.load_s:
            p.append("--cold-load-s: the cold tier cannot load faster than --load-s; raise it")
        if not 1 <= self.replica_floor <= self.replica_groups:
            p.append(f"--replica-min {self.replica_floor}: must be between 1 and --replica-groups {self.replica_groups}")
        for name in ("degraded_overhead", "straggler_slowdown"):
            if getattr(self, name) < 1:
                p.append(f"--{name.replace('_', '-')}: must be >= 1 (1: no slower than ideal)")
        if not 0 <= self.sdc_nan_share <= 1:
            p.append("--sdc-nan-share: must be between 0 and 1")
        if self.memory_blocking_s > self.memory_save_s:
            p.append(f"--memory-blocking-s {self.memory_blocking_s:g}: a memory-tier save cannot block longer than "
                     f"--memory-save-s {self.memory_save_s:g}")
        return p


def again_per_fault(faults: tuple[Fault, ...], training_h: float) -> float:
    """Failures that come back, per new failure, when the project's recovery decides: a dead node
    (`recur_h` 0) fails the next start once, then `recovery.across_progress` pins it; a code bug
    strikes once more, then the same pair makes the job give up; a node that fails again rarely
    (`recur_h` long enough that a checkpoint lands between strikes) is never pinned, so it strikes
    until the run ends, on average `training_h` / 2 after its first failure."""
    again = 0.0
    for f in faults:
        if f.code_bug or f.recur_h == 0:
            again += f.weight
        elif f.recur_h is not None:
            again += f.weight * training_h / 2 / f.recur_h
    return again / sum(f.weight for f in faults)


LLAMA3_UNEXPECTED = 419
LLAMA3_TRAINING_SHARE = 0.965
"""Share of the 54 days the job trains, the only time failures strike: what the simulator
measures for the in-allocation path (`spares`; the requeue paths train ~90%). Meta does not publish
theirs; their "higher than 90%" effective training time bounds it from below."""
_LLAMA3_TRAINING_H = 54 * 24 * LLAMA3_TRAINING_SHARE
LLAMA3_AGAIN = again_per_fault(FAULTS, _LLAMA3_TRAINING_H)
LLAMA3 = Scenario(gpus=16_384, days=54, planned_per_day=47 / 54, save_s=16_384 * 4e9 / 2e12,
                  gpu_mtbf_h=16_384 * _LLAMA3_TRAINING_H / (LLAMA3_UNEXPECTED / (1 + LLAMA3_AGAIN)),
                  sdc_gpu_mtbf_h=0.0, straggler_gpu_mtbf_h=0.0)
"""The Llama 3 paper's 54-day snapshot (Llama Team 2024, §3.3.4): 16,384 H100s, 8 per server, 419
unexpected interruptions (their mix is `failures.FAULTS`) and 47 planned ones; a save of at most
4 GB per GPU to storage sustaining 2 TB/s (33 s). It reports "higher than 90%" effective training
time. Restart time is not published: the project's own costs stand in.

Fail-slows and silent corruptions that no one saw are left out: the paper counts interruptions and
effective training time, and its 6 SDC are in the mix already (the `gpu-sdc` row).

Calibrated so the expected unexpected interruptions, recurrences included, are the 419 (Meta
counts every interruption; the failure process draws new faults, and bad nodes and code bugs add
their returns on top), over the hours the job trains:
- recurrences per new fault (`again_per_fault`, shares from Table 5): dead links 4.18% x 1,
  silent data corruption 1.43% x (54 d x 24 h x 0.965 / 2 = 625 h left on average) / 168 h,
  code bugs 0.72% x 1: 0.0418 + 0.0533 + 0.0072 = 0.102;
- new faults: 419 / 1.102 = 380, over 54 d x 24 h x 0.965 = 1,251 training hours;
- per-GPU MTBF: 16,384 x 1,251 h / 380 = 53,900 h. Spreading the 419 over all 1,296 hours
  (50,700 h) drew 6% more new faults than this, and the recurrences came on top of them."""


SOURCES = {
    "save_s": "assumed (the seed)", "blocking_s": "assumed (the seed)", "load_s": "assumed (the seed)",
    "cold_load_s": "assumed (the seed)", "cold_copy_s": "assumed (the seed)", "restart_s": "assumed (the seed)",
    "in_alloc_restart_s": "assumed (the seed)", "queue_min_s": "the seed: 2-10 minutes",
    "cred_delay_s": "configured: Slurm's AuthInfo cred_expire 120 s + 1",
    "hang_detect_s": "configured: cluster.collective_timeout_s",
    "heartbeat_s": "configured: monitor.heartbeat_timeout_s",
    "crash_detect_s": "assumed: a crash ends the step at once",
    "memory_blocking_s": "assumed: issue 23's target, a third of the async save's blocking (blocking_s); "
                         "PyTorch DCP's published async blocking, 0.78 s for Llama3-70B on 1,856 H200 (a larger "
                         "shard per GPU), bounds it from above",
    "memory_save_s": "assumed: one step (the buddy copy runs beside the next step)",
    "memory_load_s": "assumed: as memory_blocking_s (the same bytes back over the same link)",
    "buddy_load_s": "assumed: twice memory_load_s (a network hop, then the same copy)",
    "placement_s": "published: NVRx rank assignment ~0.5 s",
    "teardown_s": "published: NVRx process-group destroy ~0.5 s + last_call_wait 1 s + pending CUDA work "
                  "~one iteration (10 s)",
    "replacement_start_s": "measured: README, bench/restart.py on the sandbox, ~5 s of imports, FSDP2 set-up "
                           "and resume in a new process; not scaled",
    "rendezvous_s": "published: NVRx TCPStore barrier 0.5 s at 16k ranks",
    "data_ready_s": "assumed: the survivors rewind their loader in place; the replacement's is in its start",
    "first_step_s": "assumed: as a steady step (communicator creation is comm_init_s, apart)",
    "comm_init_s": published.COMM_INIT_SOURCE,
    "quorum_s": "published: torchft on Crusoe, cross-group Gloo reinit < 1 s (PyTorch blog, 2025-06)",
    "heal_s": "assumed: 1 s of set-up + ckpt_bytes x replica_groups per GPU over 400 Gb/s (DGX H100's "
              "ConnectX-7 per GPU)",
    "degraded_overhead": "assumed: the extra accumulation costs exactly its compute (x the ideal R/(R-1))",
    "fingerprint_s": "assumed: a checksum of a GPU's shard at HBM speed and its compare, 10 ms a step",
    "sdc_gpu_mtbf_h": "published: Llama 3, 6 SDC in 54 days on 16,384 GPUs (one every 14.7 days at 10,000 "
                      "GPUs; Gemini: every week or two)",
    "sdc_nan_share": "published: 1.01% of SDC outcomes are NaN/Inf (arXiv 2605.04213)",
    "sdc_found_after_h": "assumed: a silent corruption is found by a loss excursion or an eval within hours "
                         "(no published latency)",
    "straggler_gpu_mtbf_h": "assumed: one fail-slow a week on a 1,024-GPU job (Greyhound: 16 of 27 large jobs hit)",
    "straggler_slowdown": "published: Greyhound (ATC'25), fail-slows delay large jobs 1.34x on average",
    "straggler_duration_h": "assumed: mean 1 h (Greyhound: sub-minutes to nearly ten hours)",
    "straggler_detect_s": "assumed: a few slow steps (Greyhound detects > 99%; no latency given)",
}
"""Where each cost's default comes from; `--from-bench`, `--scale-to` and options replace them."""
COSTS_28 = ("comm_init_s", "quorum_s", "heal_s", "fingerprint_s", "sdc_gpu_mtbf_h", "sdc_found_after_h",
            "straggler_gpu_mtbf_h", "straggler_duration_h", "straggler_detect_s")
COSTS_23 = ("heartbeat_s", "crash_detect_s", "memory_blocking_s", "memory_save_s", "memory_load_s", "buddy_load_s",
            "placement_s", "teardown_s", "replacement_start_s", "rendezvous_s", "data_ready_s", "first_step_s")
