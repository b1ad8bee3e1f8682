"""The kinds of ledger event, and the base of every kind's fields."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar


class Kind(str, Enum):
    """Every kind of ledger event; the value is what `events.jsonl` spells."""

    SUBMITTED = "submitted"
    ATTEMPT = "attempt"
    START = "start"
    DATA_READY = "data_ready"
    DATA_PHASE = "data_phase"
    SOURCE_EPOCH = "source_epoch"
    SOURCE_EXHAUSTED = "source_exhausted"
    RESUME = "resume"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    RNG_RESEEDED = "rng_reseeded"
    SAVE = "save"
    SAVE_FAILED = "save_failed"
    SAVE_SKIPPED = "save_skipped"
    EMERGENCY_PLAN = "emergency_plan"
    RETENTION = "retention"
    RETENTION_FAILED = "retention_failed"
    BUDDY_COPY = "buddy_copy"
    MEMORY_SAVE = "memory_save"
    COLD_COPY = "cold_copy"
    COLD_COPY_FAILED = "cold_copy_failed"
    COLD_COPY_CANCELLED = "cold_copy_cancelled"
    COLD_COPY_DEFERRED = "cold_copy_deferred"
    COLD_RETENTION = "cold_retention"
    COLD_RETENTION_FAILED = "cold_retention_failed"
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    ANOMALY = "anomaly"
    ROLLBACK = "rollback"
    GAVE_UP = "gave_up"
    SIGNAL = "signal"
    FORCED_EXIT = "forced_exit"
    STOP = "stop"
    CRASH = "crash"
    OOM_RETRY = "oom_retry"
    OUT_OF_MEMORY = "out_of_memory"
    HOST_OOM = "host_oom"
    HANG = "hang"
    STRAGGLER = "straggler"
    PEER_LOST = "peer_lost"
    REPLICA_LEAVE = "replica_leave"
    REPLICA_HEAL = "replica_heal"
    REPLICA_JOIN = "replica_join"
    REPLICA_REFUSED = "replica_refused"
    SPARE_TOPUP = "spare_topup"
    STACKS_DUMPED = "stacks_dumped"
    FINISH = "finish"
    EXPORTED = "exported"
    EVAL_LAUNCHED = "eval_launched"
    EVAL_DONE = "eval_done"
    EVAL_FAILED = "eval_failed"
    REQUEUE = "requeue"
    RESTART_IN_ALLOCATION = "restart_in_allocation"
    NODE_UNHEALTHY = "node_unhealthy"
    REPLAY_MISMATCH = "replay_mismatch"
    REPLAY_CHECKED = "replay_checked"
    SDC = "sdc"
    RANK_EXIT = "rank_exit"
    RANKS_KILLED = "ranks_killed"
    CONFIG_ADJUSTED = "config_adjusted"
    CONFIG_CHANGED = "config_changed"
    PAUSED = "paused"
    SWEEP_STARTED = "sweep_started"
    TRIAL_LAUNCHED = "trial_launched"
    TRIAL_PAUSED = "trial_paused"
    TRIAL_PROMOTED = "trial_promoted"
    TRIAL_FINISHED = "trial_finished"
    TRIAL_PRUNED = "trial_pruned"
    TRIAL_FAILED = "trial_failed"
    PBT_GENERATION = "pbt_generation"
    EXPLOIT = "exploit"
    EXPLORE = "explore"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Details:
    """The fields of one kind of event (subclasses); `KIND` names the kind."""

    KIND: ClassVar[Kind]
