"""The run's ledger: `events.jsonl`, one JSON object per line, appended by every rank.

Each line has a UTC `time`, the `event` kind, the `step` and the writing `rank`; in Slurm jobs the
`job_id`, `restart` (requeue count), `job_step` and `node` of the attempt; then the fields of its
kind. This package is the one catalog of kinds and their fields: writers pass a typed `Details` (so
the type checker sees every field), readers get `Event`s back and narrow them with `select`. Every
ledger this version writes reads back exactly; older ones read tolerantly (`log`).

Modules:
    kinds           every kind of event (Kind), and the base of their fields (Details)     [pure]
    launch_events   submitted, attempt, start, data ready and phases, resume, config adjusted [pure]
    save_events     saves, their failures, emergency plans, retention, copies, the interval   [pure]
    fault_events    anomalies, rollbacks, signals, forced exits, crashes, OOM, hangs, stragglers,
                    restarts, replays                                                        [pure]
    replica_events  a replica group's leave, heal and join; a refusal to go on without one    [pure]
    sweep_events    a search's study ledger and a trial's own                                 [pure]
    eval_events     benchmark evaluations beside training: launched, done, failed             [pure]
    log             the writer (EventLog) and the readers (read_events, read_new_events, select)

Every name is re-exported here: `from resilient_slurm.ledger import Save, EventLog, ...`.
"""

from resilient_slurm.ledger.kinds import Details, Kind
from resilient_slurm.ledger.launch_events import (
    Submitted,
    Attempt,
    Start,
    ConfigAdjusted,
    DataReady,
    DataPhase,
    SourceEpoch,
    SourceExhausted,
    Resume,
    CheckpointSkipped,
    RngReseeded,
)
from resilient_slurm.ledger.save_events import (
    Save,
    SaveFailed,
    SaveSkipped,
    EmergencyPlan,
    Retention,
    RetentionFailed,
    BuddyCopy,
    MemorySave,
    ColdCopy,
    ColdCopyFailed,
    ColdCopyCancelled,
    ColdCopyDeferred,
    ColdRetention,
    ColdRetentionFailed,
    CheckpointInterval,
)
from resilient_slurm.ledger.fault_events import (
    Anomaly,
    Rollback,
    GaveUp,
    Signal,
    ForcedExit,
    Stop,
    Crash,
    OomRetry,
    OutOfMemory,
    HostOom,
    Hang,
    Straggler,
    PeerLost,
    StacksDumped,
    Finish,
    Exported,
    Requeue,
    RestartInAllocation,
    NodeUnhealthy,
    ReplayChecked,
    ReplayMismatch,
    Sdc,
    RankExit,
    RanksKilled,
)
from resilient_slurm.ledger.replica_events import ReplicaHeal, ReplicaJoin, ReplicaLeave, ReplicaRefused, SpareTopup
from resilient_slurm.ledger.sweep_events import (
    ConfigChanged,
    Paused,
    SweepStarted,
    TrialLaunched,
    TrialPaused,
    TrialPromoted,
    TrialFinished,
    TrialPruned,
    TrialFailed,
    PbtGeneration,
    Exploit,
    Explore,
)
from resilient_slurm.ledger.eval_events import EvalDone, EvalFailed, EvalLaunched
from resilient_slurm.ledger.log import (
    CATALOG,
    FAILURES,
    LEDGER_FILE,
    Event,
    EventLog,
    Unknown,
    parse,
    read_events,
    read_jsonl,
    read_new_events,
    select,
)

__all__ = [
    "Anomaly", "Attempt", "BuddyCopy", "CATALOG", "CheckpointInterval", "CheckpointSkipped", "ColdCopy",
    "ColdCopyCancelled", "ColdCopyDeferred", "ColdCopyFailed", "ColdRetention", "ColdRetentionFailed",
    "ConfigAdjusted", "ConfigChanged", "Crash", "DataPhase", "DataReady", "Details", "SourceEpoch", "SourceExhausted", "EmergencyPlan", "EvalDone", "EvalFailed", "EvalLaunched", "Event", "EventLog",
    "Exploit", "Explore", "Exported", "FAILURES", "Finish", "ForcedExit", "GaveUp", "Hang", "HostOom", "PeerLost", "Kind", "MemorySave", "LEDGER_FILE",
    "NodeUnhealthy", "OomRetry", "OutOfMemory", "Paused", "PbtGeneration", "RankExit", "RanksKilled", "ReplayChecked", "ReplayMismatch", "Requeue",
    "ReplicaHeal", "ReplicaJoin", "ReplicaLeave", "ReplicaRefused", "SpareTopup",
    "RestartInAllocation", "Resume", "Retention", "RetentionFailed", "RngReseeded", "Rollback", "Save", "SaveFailed",
    "SaveSkipped", "Sdc", "Signal", "StacksDumped", "Start", "Stop", "Straggler", "Submitted", "SweepStarted", "TrialFailed",
    "TrialFinished", "TrialLaunched", "TrialPaused", "TrialPromoted", "TrialPruned", "Unknown", "parse",
    "read_events", "read_jsonl", "read_new_events", "select",
]
