"""Typed configuration: the dataclasses Hydra fills, and their validation.

Every default lives here, once, with its doc beneath it: `register_schema` hands these defaults to
Hydra as the base of `conf/config.yaml`, and `conf/` holds only presets that differ (experiments,
model sizes, checkpoint policies, clusters). `launch` converts Hydra's DictConfig to these objects
once (`to_config`); nothing deeper sees a DictConfig. Validation reports every problem at once, each
as one line naming the key and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config value is wrong; the message is one line naming the key and the fix."""


@dataclass
class RunConfig:
    root: str = "experiments"
    """Experiments root: runs live in `<root>/<experiment>/<name>/`."""
    experiment: str = "default"
    """Experiment name (set by the `+experiment=` file)."""
    name: str | None = None
    """Run name; generated from the config when null. Launching an existing name resumes it."""
    fork: bool = False
    """Launching an existing name with a changed config starts a new run `<name>-forkN` whose record
    names its parent, instead of refusing (the fork starts from scratch, not from the parent's weights)."""
    baseline: str | None = None
    """Name of the run (same experiment) this one is an ablation of: sets the wandb group
    `ablation-<component>-<baseline>-vs-<variant>` from the keys that differ."""
    require: list[str] = field(default_factory=list)
    """Keys a recipe cannot run without (e.g. model.pretrained, data.path): each must be set."""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama decoder layer (Hugging Face names): what LoRA can adapt."""


@dataclass
class LoRAConfig:
    rank: int | None = None
    """Train LoRA adapters of this rank on `targets` instead of every weight; null: a full fine-tune.
    The base model is frozen (held in bfloat16, rebuilt from its files at every start); the
    adapters train in float32. Checkpoints hold the adapters, their optimizer state and the base's
    identity; hf/ then holds a PEFT adapter (`python -m resilient_slurm.export RUN OUT --merge`
    writes the merged model)."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank (PEFT's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (PEFT's lora_dropout)."""
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Layers of every decoder layer that get adapters, by name: the attention projections by
    default; any of LORA_TARGETS (the MLP's gate_proj, up_proj, down_proj too)."""


@dataclass
class ModelConfig:
    pretrained: str | None = None
    """A Hugging Face Llama model directory (config.json, safetensors weights, tokenizer files) to
    fine-tune. Its config.json sets every dimension below at launch (none is copied by hand); the
    weights are read shard by shard, each rank only its own rows. Null: random initialisation."""
    name: str = "llama-tiny"
    """Short model name, used in generated run names (the directory's name when `pretrained` is set)."""
    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    """Grouped-query attention: key/value heads shared by num_heads // num_kv_heads query heads."""
    head_dim: int | None = None
    """Per-head dimension; null: hidden_size // num_heads."""
    max_seq_len: int = 256
    """Longest sequence the model is trained on (HF max_position_embeddings)."""
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """HF rope_scaling, e.g. Llama-3.1's {rope_type: llama3, factor: 8, low_freq_factor: 1,
    high_freq_factor: 4, original_max_position_embeddings: 8192}; null: none."""
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    """Written to the exported config.json; from the pretrained config, else from the tokenizer."""
    dtype: str = "float32"
    """Compute dtype (float32 or bfloat16). Master weights, gradients' reduction and AdamW state are
    always float32 (FSDP2 MixedPrecisionPolicy): bf16 parameters lose small updates on long runs.
    With `lora.rank`, the frozen base is held in bfloat16 whatever this says (it never updates)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass: ~1/25 of the activation
    memory for about a third more compute."""
    init_std: float = 0.02
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class DataConfig:
    task: str = "tiny-chat"
    """Dataset name, used in generated run names."""
    path: str = "asset:tiny_chat/chat.jsonl"
    """A chat .jsonl file or a directory of them: `messages` (system/user/assistant, multi-turn) or
    `prompt`/`completion` lines. `asset:tiny_chat/chat.jsonl` is the small set the package ships."""
    tokenizer: str = "asset:tiny_chat"
    """Hugging Face directory with tokenizer.json and the chat template; empty = model.pretrained.
    `asset:tiny_chat` is the small one the package ships."""
    seq_len: int = 128
    """Tokens per row: conversations are packed into rows of this length, each attending only to itself."""
    global_batch_size: int = 8
    """Rows per optimizer step over all ranks; kept constant when the world size changes."""
    micro_batch_size: int = 4
    """Rows per forward/backward on one rank; accumulation = global / (micro * ranks). Where it does
    not fit in device memory, the run lowers it (ledger: oom_retry) and keeps the lower value on later
    starts with this same setting; how the rows are cut does not change what a step computes."""
    val_samples: int = 256
    """Conversations held out for evaluation, never trained on: those with the smallest content
    hashes (a fixed set whatever the file order or world size), every copy of each."""
    loss: str = "assistant"
    """Tokens trained on: assistant (every assistant turn), last (the last one only), or all."""
    overlong: str = "truncate"
    """A conversation longer than seq_len is truncated to it, or dropped; both are counted."""
    bad_lines: str = "error"
    """A malformed line stops the run with its file:line (error), or is skipped and counted (skip)."""
    cache_dir: str = ""
    """Where tokenized data is cached (keyed by data, tokenizer and settings); empty =
    <run.root>/.cache/tokenized."""


@dataclass
class OptimConfig:
    lr: float = 1e-4
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""


@dataclass
class TrainConfig:
    max_steps: int = 300
    seed: int = 1234
    log_every_steps: int = 10
    deterministic: bool = True
    """torch.use_deterministic_algorithms: needed for bit-identical resume."""
    threads: int = 0
    """torch intra-op threads per rank; 0 = cores / local ranks."""
    pause_at_step: int = 0
    """Save and end the attempt (exit status 75, a `paused` event) on reaching this step, to be
    launched again later with a later pause or none: how a search pauses a trial at an ASHA rung or
    a PBT generation (0 = never)."""


@dataclass
class ColdTierConfig:
    url: str = ""
    """Cold tier: a shared filesystem path or any fsspec URL (s3://bucket/prefix); empty = off.
    Each committed checkpoint is copied to <url>/<experiment>/<run>/ in the background, read back
    to verify it, and kept by the rules below; a run whose hot tier is empty resumes from here.
    Credentials and endpoints come from the store's own environment (S3: AWS_* variables,
    AWS_ENDPOINT_URL for a non-AWS server)."""
    keep_last: int = 10
    """Retention in the cold tier: keep the newest K copies (at least 2)."""
    keep_every_steps: int = 0
    """Milestones kept forever in the cold tier (0 = none)."""
    optimizer_on_last: int = 2
    """Keep optimizer state only on the newest M copies in the cold tier (0 = on all)."""


@dataclass
class MemoryTierConfig:
    every_steps: int = 0
    """Save to host memory every N steps (0 = off): each rank's shards go to files under `dir` on
    its own node, are copied to a buddy node's memory, and a restart loads from there before the
    disk tiers. The loop waits only until the state is copied out of the live tensors (on a GPU,
    the device-to-host copy)."""
    dir: str = "/dev/shm/resilient_slurm"
    """Where each node keeps the tier: <dir>/<experiment>/<run>/, in memory that outlives the
    process (tmpfs); `%n` becomes the node's name (needed only when several nodes share a machine)."""
    keep_last: int = 1
    """Memory checkpoints each node keeps (1 or 2), besides the one being written."""


@dataclass
class CheckpointConfig:
    every_steps: int = 1000
    """Save every N steps (0 = off): milestones."""
    exponential_first_step: int = 0
    """Exponential policy: save at E, 2E, 4E, ... (0 = off)."""
    every_minutes: float = 30.0
    """Save when this many minutes passed since the last save (0 = off): bounds what a fault can cost."""
    keep_last: int = 5
    """Retention: keep the newest K checkpoints (at least 2: the newest may be mid-save)."""
    keep_every_steps: int = 0
    """Milestones: checkpoints at multiples of this step are never deleted (0 = none)."""
    optimizer_on_last: int = 2
    """Keep optimizer state only on the newest M checkpoints (0 = on all)."""
    save_final: bool = True
    max_shard_bytes: int = 1 << 30
    """Split weights and optimizer state into files of at most this size (bytes)."""
    io_threads: int = 4
    """Threads writing and reading shard files in parallel on each rank."""
    async_save: bool = True
    """Copy the state into reusable host buffers and write, check and commit it on a background
    thread: the loop blocks only for the copy. Final and emergency saves are always synchronous."""
    if_busy: str = "wait"
    """A save falls due while the previous one is still being written: wait for it, or skip."""
    on_failure: str = "continue"
    """A save failed (disk full, I/O error; the previous checkpoints stay): continue training, or
    stop the run (exit status 1, failure) at the next save point."""
    hot_dir: str = ""
    """Hot tier for the newest checkpoints: <hot_dir>/<experiment>/<run>/; empty = the run
    directory's checkpoints/. Without `%n`, every rank of the job must see the same directory.
    With `%n` (the node's name, e.g. /nvme/%n/ckpt) it is node-local: each node keeps the files its
    ranks write, and after each save copies them to a buddy node over the network, so a checkpoint
    survives the loss of any one node; a resume reads local, then buddy, then cold copies."""
    cold: ColdTierConfig = field(default_factory=ColdTierConfig)
    memory: MemoryTierConfig = field(default_factory=MemoryTierConfig)
    young_daly: bool = False
    """Set the time-based interval to sqrt(2 x save cost x MTBF) (Young-Daly) from the measured
    cost of saves (time the loop was blocked) and the failure rate seen in events.jsonl across
    attempts, within [min_interval_s, max_interval_s]; replaces every_minutes."""
    mtbf_prior_h: float = 24.0
    """Young-Daly, and whether a shrunk run grows back (slurm/driver.py): the mean time between
    failures assumed before any is observed (it counts as one failure in that much time, so
    observed failures move the estimate gradually)."""
    min_interval_s: float = 60.0
    max_interval_s: float = 3600.0
    prior_write_gb_per_s: float = 0.25
    """Emergency saves: checkpoint write speed assumed until a save of this run was measured."""
    emergency_reserve_s: float = 10.0
    """Emergency saves: seconds kept free at the end of the grace window to requeue and exit."""


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
    nodes: int = 1
    """Nodes the training runs on."""
    spare_nodes: int = 0
    """Nodes allocated beyond `nodes` and kept idle: when a node of the run fails, the job's
    driver restarts training on a spare inside the same allocation (a new job step from the
    newest checkpoint; no trip through the queue). A node that failed is never used again in
    that allocation. With spares or elastic.min_nodes set, the job's batch script runs the driver
    (slurm/driver.py), which runs training as job steps."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
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
    signal_lead_s: int = 120
    """Lead time of the warning signal; Slurm delivers it up to 30 s earlier than asked."""
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


@dataclass
class MonitorConfig:
    """In-training fault detection (resilient_slurm/monitor/detectors.py) and what to do about findings."""

    enabled: bool = True
    window: int = 50
    """Recent steps the robust statistics (median, MAD) are taken over."""
    min_history: int = 20
    """Steps of history before the relative detectors judge anything."""
    loss_spike_mads: float = 8.0
    """Spike: loss above median + this many MADs (0 disables) ..."""
    loss_spike_min_rise: float = 0.5
    """... and at least this fraction above the median, so a quiet window cannot trigger on noise."""
    plateau_steps: int = 1000
    """Report when the loss has not improved for this many steps (0 disables); never acted on."""
    plateau_min_improvement: float = 0.01
    grad_norm_max: float = 0.0
    """Explosion: gradient norm above this (0 disables the absolute limit) ..."""
    grad_norm_factor: float = 20.0
    """... or above this multiple of its recent median (0 disables)."""
    grad_vanish_below: float = 0.0
    """Vanishing: gradient norm at or below this."""
    throughput_drop_ratio: float = 0.5
    """Throughput drop: tokens/s below this fraction of the recent median ..."""
    throughput_drop_steps: int = 5
    """... for this many consecutive steps."""
    slow_rank_factor: float = 2.0
    """Slow rank: one rank's compute time above this multiple of the others' median (0 disables) ..."""
    slow_rank_min_s: float = 0.05
    """... and at least this many seconds slower, so millisecond jitter on tiny steps is no finding ..."""
    slow_rank_steps: int = 3
    """... on this many consecutive steps."""
    data_stall_s: float = 30.0
    """Data-loader stall: a rank waited longer than this for its batch (0 disables)."""
    hang_factor: float = 20.0
    """Hang: no step completed within this multiple of the median step time ..."""
    hang_floor_s: float = 300.0
    """... and never less than this."""
    hang_first_step_s: float = 900.0
    """Before any step has completed (start-up, first compile): the limit for the first step."""
    rollback_on: list[str] = field(default_factory=lambda: ["loss_nan", "loss_spike"])
    """Findings that roll back to the checkpoint before the anomaly and skip its data window."""
    max_rollbacks: int = 3
    """Rollbacks per run; one more anomaly after that stops the run (do not requeue)."""
    rollback_skip_batches: int = 200
    """Global batches skipped after the restored checkpoint (PaLM skipped 200-500)."""
    rollback_lr_factor: float = 1.0
    """Multiply the learning rate by this at each rollback (1 keeps it)."""
    rss_every_steps: int = 10
    """Read each rank's resident host memory every N steps, for the leak detector (0 disables)."""
    leak_window: int = 30
    """Leak: samples of resident memory (one every rss_every_steps) the slope is taken over ..."""
    leak_mb_per_step: float = 1.0
    """... rising at least this many MB per step (the median of the slopes between every two samples,
    so start-up growth and single jumps do not count) ..."""
    leak_min_growth_mb: float = 256.0
    """... and by at least this much over the window."""
    gpu_sample_s: float = 10.0
    """How often the NVML sampler thread reads GPU utilization, memory, temperature and ECC counters."""
    gpu_util_min_pct: float = 50.0
    gpu_temp_max_c: float = 85.0
    gpu_memory_max_frac: float = 0.98


@dataclass
class HealthConfig:
    """The job's own node-health checks (resilient_slurm/slurm/health_watch.py), in Slurm jobs."""

    preflight: bool = True
    """Check each node before training starts; a node that fails is refused and the job requeued without it."""
    check_every_s: float = 60.0
    """Check again this often while training (0: only at start)."""
    kernel_log: str | None = None
    """Read this file instead of the kernel log (/dev/kmsg); "%n" becomes the node name
    (as in Slurm's own file patterns)."""
    expect_gpus: int | None = None
    """GPUs each node must show (NVML); null: cluster.gpus_per_node when it is set."""
    drain: bool = False
    """Also drain a failing node with scontrol (needs Slurm operator rights; the Epilog does it otherwise)."""
    exclude_ttl_h: float = 24.0
    """How long a failing node stays on the exclude list (cluster.exclude_file)."""
    timeout_s: float = 30.0
    """A check that has not finished by then counts as a failed node, never a pass."""


@dataclass
class TrackingConfig:
    mode: str = "offline"
    """offline: wandb writes under the run directory and nothing leaves the machine (upload later
    with `wandb sync`); online; disabled. WANDB_MODE can only make it more private, never less."""
    project: str | None = None
    """wandb project; null: the run's experiment name."""
    entity: str | None = None
    """wandb entity (user or team); null: the logged-in user's default."""
    tags: list[str] = field(default_factory=list)
    """wandb tags of the run."""


@dataclass
class EvalConfig:
    every_steps: int = 0
    """Evaluate on the held-out split every N steps and at the last step (0 = off)."""
    task_samples: int = 128
    """Validation samples (the first of data.val_samples, which the validation loss covers) that the
    task metrics judge; for the built-in exact match, each response is decoded greedily (0 = none)."""
    predictions: int = 8
    """Rows (prompt, target, prediction) in each evaluation's table of sample predictions."""


@dataclass
class FaultConfig:
    """Fault injection for tests and drills; everything off by default."""

    step_sleep_s: float = 0.0
    """Sleep this long in every step (on `ranks`): a slow GPU, or pacing for tests."""
    raise_at_step: int = 0
    """Raise an exception when this step begins (on `ranks`), on every attempt: a code bug."""
    nan_at_step: int = 0
    """Make the loss NaN at this step, with the data originally scheduled for it: a bad batch.
    After a rollback skips that data, the step runs clean."""
    hang_at_step: int = 0
    """Stop making progress at this step (on `ranks`): a hung GPU or a deadlock."""
    oom_at_step: int = 0
    """Raise torch.OutOfMemoryError, what the CUDA allocator raises, in the forward of this step (on
    `ranks`) while the micro-batch is data.micro_batch_size: a step that fits only at a smaller one."""
    leak_mb_per_step: float = 0.0
    """Keep this many more MB of host memory every step (on `ranks`): a leak."""
    ranks: list[int] = field(default_factory=list)
    """Ranks the faults apply to (empty: all)."""


@dataclass
class SweepConfig:
    """Hyperparameter search, `python -m resilient_slurm.sweep` (resilient_slurm/sweep/): each trial is
    an ordinary run. `sweep=grid|random|optuna|asha|pbt` are presets (conf/sweep/) of these keys."""

    name: str | None = None
    """Study name: <run.root>/<experiment>/sweeps/<name>/; null: spelled from the search and a hash
    of the command, so the same command finds (and resumes) the same study."""
    sampler: str = "random"
    """How trial parameters are chosen: grid (every point, in order), random, or tpe (Optuna's TPE)."""
    pruner: str = "none"
    """Stop unpromising trials on their intermediate results: none, median, halving (successive
    halving) or hyperband (Optuna's pruners); the pruned trial's job is cancelled."""
    scheduler: str = "none"
    """none; asha: trials pause at rungs and are resumed when promoted; pbt: a population of `trials`
    members that exploit and explore every `interval_steps`."""
    trials: int = 0
    """Trials to run (pbt: the population size); 0 = every point of the grid (sampler=grid only)."""
    parallel: int = 2
    """Trials (jobs, or local processes) in flight at most."""
    budget_steps: int = 0
    """Start no trial or promotion that could take the trial-steps of the study over this (0 = no
    limit): a compute budget shared by every strategy."""
    metric: str = "val_loss"
    """The objective: a column of the trials' metrics.jsonl (val_loss needs eval.every_steps)."""
    direction: str = "minimize"
    """minimize or maximize."""
    seed: int = 0
    """Seed of the sampler and of the PBT and ASHA decisions."""
    startup_trials: int = 5
    """TPE: random trials before it models; median pruner: trials that must finish before it prunes."""
    prune_after_steps: int = 0
    """Pruners judge no trial before this step."""
    min_steps: int = 0
    """ASHA: the first rung (steps); later rungs are reduction_factor times apart, up to
    train.max_steps. 0 = train.max_steps / reduction_factor**2."""
    reduction_factor: int = 3
    """ASHA: a trial is promoted from a rung when it is in the best 1/reduction_factor there;
    halving/hyperband pruners: their reduction factor."""
    interval_steps: int = 0
    """PBT: steps between exploit/explore rounds (0 = train.max_steps / 4)."""
    quantile: float = 0.25
    """PBT: the bottom fraction copies a member of the top fraction (at least one member each)."""
    resample_probability: float = 0.25
    """PBT explore: resample a value from the search space with this probability, else perturb it."""
    perturb_factors: list[float] = field(default_factory=lambda: [0.8, 1.2])
    """PBT explore: a numeric value is multiplied by one of these (a choice moves to a neighbour)."""
    controller: str = "here"
    """Where the controller runs: here (this process: a login node, a laptop) or slurm (a small
    requeueable job of its own; needs cluster=slurm)."""
    controller_time_min: int = 60
    """sweep.controller=slurm: the controller job's time limit; it requeues itself before it."""
    poll_s: float = 10.0
    """Seconds between two looks at the trials (their jobs and metrics)."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)


LOSS_MODES = ("assistant", "all", "last")
# Keys that change where or how a run executes, not what it computes: a relaunch may change them,
# and they are never part of a run's name.
# The micro-batch is one: the loss is normalised by the global batch's token count, so cutting the same
# rows into other micro-batches changes only the order of a sum, as a new world size does.
PLACEMENT_PREFIXES = ("run.", "cluster.", "checkpoint.", "monitor.", "health.", "fault.", "tracking.", "eval.",
                      "train.log_every_steps", "train.threads", "train.pause_at_step", "data.cache_dir", "sweep.",
                      "data.micro_batch_size")
FINDINGS = ("loss_nan", "loss_spike", "loss_plateau", "grad_explosion", "grad_vanishing", "throughput_drop",
            "slow_rank", "data_stall", "gpu_underutilized", "gpu_hot", "gpu_memory_full", "gpu_ecc", "memory_leak")
DTYPES = ("float32", "bfloat16")
TRACKING_MODES = ("offline", "online", "disabled")
SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "halving", "hyperband")
SCHEDULERS = ("none", "asha", "pbt")


def register_schema() -> None:
    """Store the dataclass defaults as Hydra's config `schema`, the first entry of conf/config.yaml's
    defaults list: every key exists (so `key=value` overrides need no `+`) with its one default.
    Stored untyped, so a wrongly typed value reaches `to_config` and gets its one-line error."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=to_dict(Config()))


@dataclass(frozen=True)
class Adjustment:
    """A value the user did not choose, changed to fit the values the user did choose."""

    key: str
    old: Any
    new: Any
    why: str

    def __str__(self) -> str:
        return f"{self.key}: {self.old} -> {self.new}: {self.why}"


def to_config(cfg: DictConfig | dict[str, Any], explicit: Iterable[str] = (),
              adjustments: list[Adjustment] | None = None,
              resolve_model: Callable[[ModelConfig], ModelConfig] | None = None) -> Config:
    """Resolve, type-check and validate a composed config; raise ConfigError listing every problem,
    one line each. `explicit` names the keys the user set on the command line: defaults that do not
    fit are adjusted only where the user did not choose them, and each change is appended to
    `adjustments`. `resolve_model` fills in what the model's own files say (its dimensions, from a
    pretrained directory) before the values are checked against each other."""
    container = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    container = {k: v for k, v in container.items() if k != "hydra"}
    problems: list[str] = []
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), container)
    except OmegaConfBaseException:
        # Find each bad value (merging key by key), then go on without them for the other checks.
        merged = OmegaConf.structured(Config)
        for key, value in flatten(container).items():
            try:
                merged = OmegaConf.merge(merged, _nested(key, value))
            except OmegaConfBaseException as e:
                problems.append(_type_problem(key, e))
    try:
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(_type_problem(getattr(e, "full_key", None) or "config", e)) from None
    assert isinstance(typed, Config)
    if resolve_model is not None and not problems:
        try:
            typed.model = resolve_model(typed.model)
        except ValueError as e:
            raise ConfigError(f"model.pretrained: {e}") from None
    adjusted = fit_warmup(typed, set(explicit))
    if adjusted and adjustments is not None:
        adjustments.append(adjusted)
    problems += validate(typed)
    if problems:
        raise ConfigError("\n".join(problems))
    return typed


def fit_warmup(cfg: Config, explicit: set[str]) -> Adjustment | None:
    """A warmup the user did not choose that does not fit a short run (a smoke run of a recipe with
    `train.max_steps=20`) is cut to a tenth of the run. A warmup set on the command line is the
    user's: validation still refuses it if it does not fit."""
    o, t = cfg.optim, cfg.train
    if "optim.warmup_steps" in explicit or t.max_steps < 1 or o.warmup_steps < t.max_steps:
        return None
    old = o.warmup_steps
    o.warmup_steps = t.max_steps // 10
    return Adjustment("optim.warmup_steps", old, o.warmup_steps,
                      f"the preset's warmup does not fit train.max_steps={t.max_steps}; set optim.warmup_steps "
                      f"to choose another")


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """The config keys a list of Hydra overrides sets (`optim.lr=1e-4`, `+run.name=x`, `~key`)."""
    return {item.lstrip("+~").partition("=")[0] for item in overrides if "=" in item}


def _nested(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _type_problem(key: str, e: Exception) -> str:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{key}: {first}; fix the value or remove the key"


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of a typed config (what config.yaml holds)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def validate(cfg: Config) -> list[str]:
    """Every semantic problem, each one line: `key: what is wrong; fix`."""
    p: list[str] = []
    m, d, o, t, c, k = cfg.model, cfg.data, cfg.optim, cfg.train, cfg.checkpoint, cfg.cluster

    def need(ok: bool, msg: str) -> None:
        # One line per key: the first problem found with it.
        if not ok and msg.split(":")[0] not in {line.split(":")[0] for line in p}:
            p.append(msg)

    need(bool(cfg.run.root), "run.root: empty; set it to the experiments directory")
    values = flatten(cfg)
    for key in cfg.run.require:
        need(key in values and values[key] not in (None, ""),
             f"{key}: +experiment={cfg.run.experiment} needs it; set {key}=..." if key in values
             else f"run.require: {key!r} is not a config key; fix the recipe")
    if p:
        return p  # without what the recipe needs (its model, its data) the other checks would mislead
    need(cfg.run.name is None or _safe_name(cfg.run.name),
         f"run.name: {cfg.run.name!r} is not a plain name; use letters, digits, '.', '_', '-'")
    need(_safe_name(cfg.run.experiment),
         f"run.experiment: {cfg.run.experiment!r} is not a plain name; use letters, digits, '.', '_', '-'")
    need(m.hidden_size % m.num_heads == 0,
         f"model.hidden_size: {m.hidden_size} is not divisible by model.num_heads={m.num_heads}; change one")
    need(m.num_heads % m.num_kv_heads == 0,
         f"model.num_kv_heads: {m.num_kv_heads} does not divide model.num_heads={m.num_heads}; pick a divisor")
    need((m.hidden_size // max(m.num_heads, 1)) % 2 == 0,
         "model.hidden_size: head dim must be even for rotary embeddings; change hidden_size or num_heads")
    need(m.dtype in DTYPES, f"model.dtype: {m.dtype!r} unknown; use one of {', '.join(DTYPES)}")
    lora = m.lora
    need(lora.rank is None or lora.rank >= 1,
         f"model.lora.rank: {lora.rank}; set a rank of 1 or more, or null for a full fine-tune")
    need(lora.alpha > 0, f"model.lora.alpha: {lora.alpha}; set it > 0 (the adapters are scaled by alpha / rank)")
    need(0 <= lora.dropout < 1, f"model.lora.dropout: {lora.dropout}; set it within [0, 1)")
    unknown_targets = [t for t in lora.targets if t not in LORA_TARGETS]
    need(not unknown_targets and bool(lora.targets),
         f"model.lora.targets: {unknown_targets[0]!r} matches no layer of the model; use some of "
         f"{', '.join(LORA_TARGETS)}" if unknown_targets else
         f"model.lora.targets: empty; use some of {', '.join(LORA_TARGETS)}")
    need(d.seq_len <= m.max_seq_len,
         f"data.seq_len: {d.seq_len} exceeds model.max_seq_len={m.max_seq_len}; lower it or raise max_seq_len")
    need(bool(d.path), "data.path: empty; set data.path=FILE.jsonl (or a directory of .jsonl files)")
    # A recipe that requires model.pretrained says so already; its tokenizer comes from there.
    need(bool(d.tokenizer or m.pretrained) or "model.pretrained" in cfg.run.require, "data.tokenizer: empty and model.pretrained is not set; set one of them "
                                            "to a Hugging Face directory with tokenizer.json and a chat template")
    need(d.loss in LOSS_MODES, f"data.loss: {d.loss!r} unknown; use one of {', '.join(LOSS_MODES)}")
    need(d.overlong in ("truncate", "drop"), f"data.overlong: {d.overlong!r}; use truncate or drop")
    need(d.bad_lines in ("error", "skip"), f"data.bad_lines: {d.bad_lines!r}; use error or skip")
    per_step = d.micro_batch_size * world_size(k)
    need(d.micro_batch_size >= 1, f"data.micro_batch_size: {d.micro_batch_size}; set it to 1 or more")
    need(d.global_batch_size % max(per_step, 1) == 0,
         f"data.global_batch_size: {d.global_batch_size} is not a multiple of micro_batch_size*ranks="
         f"{per_step}; change one of them")
    need(o.lr > 0, f"optim.lr: {o.lr}; set a learning rate > 0")
    need(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio: {o.min_lr_ratio}; set it within [0, 1]")
    need(0 <= o.warmup_steps < max(t.max_steps, 1) or t.max_steps == 0,
         f"optim.warmup_steps: {o.warmup_steps} must be below train.max_steps={t.max_steps}; lower it or "
         f"raise train.max_steps")
    need(o.grad_clip >= 0, f"optim.grad_clip: {o.grad_clip}; set it >= 0 (0 disables clipping)")
    need(t.max_steps >= 1, f"train.max_steps: {t.max_steps}; set it to 1 or more")
    need(t.log_every_steps >= 1, f"train.log_every_steps: {t.log_every_steps}; set it to 1 or more")
    need(c.keep_last >= 2, f"checkpoint.keep_last: {c.keep_last}; keep at least 2 (the newest may be mid-save)")
    need(c.every_steps >= 0 and c.exponential_first_step >= 0 and c.every_minutes >= 0,
         "checkpoint.every_steps: every_steps, exponential_first_step and every_minutes must be >= 0; "
         "use 0 to turn one off")
    need(c.optimizer_on_last >= 0, f"checkpoint.optimizer_on_last: {c.optimizer_on_last}; set it >= 0 (0 = on all)")
    need(c.max_shard_bytes >= 1 << 20, f"checkpoint.max_shard_bytes: {c.max_shard_bytes}; set at least 1 MiB (1048576)")
    need(c.io_threads >= 1, f"checkpoint.io_threads: {c.io_threads}; set it to 1 or more")
    need(c.if_busy in ("wait", "skip"), f"checkpoint.if_busy: {c.if_busy!r}; use wait or skip")
    need(c.on_failure in ("continue", "stop"), f"checkpoint.on_failure: {c.on_failure!r}; use continue or stop")
    need(c.cold.keep_last >= 2, f"checkpoint.cold.keep_last: {c.cold.keep_last}; keep at least 2")
    need(c.cold.optimizer_on_last >= 0 and c.cold.keep_every_steps >= 0,
         "checkpoint.cold.keep_every_steps: it and checkpoint.cold.optimizer_on_last must be >= 0; use 0 "
         "for none / on all")
    need(c.memory.every_steps >= 0, f"checkpoint.memory.every_steps: {c.memory.every_steps}; set it >= 0 (0 = off)")
    need(c.memory.keep_last in (1, 2), f"checkpoint.memory.keep_last: {c.memory.keep_last}; keep 1 or 2")
    need(c.memory.dir.startswith("/"),
         f"checkpoint.memory.dir: {c.memory.dir!r} is not an absolute path; use one on tmpfs, e.g. /dev/shm/resilient_slurm")
    need(0 < c.min_interval_s <= c.max_interval_s,
         "checkpoint.min_interval_s: must be > 0 and at most checkpoint.max_interval_s; fix one of them")
    need(c.mtbf_prior_h > 0, f"checkpoint.mtbf_prior_h: {c.mtbf_prior_h}; set it > 0")
    need(c.prior_write_gb_per_s > 0 and c.emergency_reserve_s >= 0,
         "checkpoint.prior_write_gb_per_s: must be > 0, and checkpoint.emergency_reserve_s >= 0; fix the "
         "value")
    need(k.kind in ("local", "slurm"), f"cluster.kind: {k.kind!r} unknown; use cluster=local or cluster=slurm")
    need(k.ranks >= 1, f"cluster.ranks: {k.ranks}; set it to 1 or more")
    need(k.nodes >= 1 and k.tasks_per_node >= 1, f"cluster.nodes: {k.nodes}, cluster.tasks_per_node: {k.tasks_per_node}; set both to 1 or more")
    need(k.time_min >= 1, f"cluster.time_min: {k.time_min}; Slurm time limits are whole minutes >= 1")
    need(k.signal != "TERM", "cluster.signal: TERM cannot be the time-limit warning: scancel and preemption send "
                             "TERM too and a job cannot tell them apart, so it would never requeue itself; use USR1 "
                             "or USR2")
    need(k.signal in ("USR1", "USR2", "TERM"), f"cluster.signal: {k.signal!r}; use USR1 or USR2")
    need(0 < k.signal_lead_s < k.time_min * 60,
         f"cluster.signal_lead_s: {k.signal_lead_s}; set it above 0 and below cluster.time_min*60")
    need(k.max_restarts >= 0, f"cluster.max_restarts: {k.max_restarts}; set it >= 0")
    p += validate_allocation(cfg)
    need(k.term_grace_s > 0, f"cluster.term_grace_s: {k.term_grace_s}; set it > 0 (the partition's GraceTime, or KillWait)")
    need(k.gpus_per_node >= 0, f"cluster.gpus_per_node: {k.gpus_per_node}; set it >= 0")
    need(cfg.health.check_every_s >= 0 and cfg.health.timeout_s > 0 and cfg.health.exclude_ttl_h > 0,
         "health.check_every_s: must be >= 0, health.timeout_s and health.exclude_ttl_h > 0; fix the value")
    mon = cfg.monitor
    unknown_kinds = sorted(set(mon.rollback_on) - set(FINDINGS))
    need(not unknown_kinds, f"monitor.rollback_on: unknown finding(s) {', '.join(unknown_kinds)}; use {', '.join(FINDINGS)}")
    need(mon.window >= 3 and 1 <= mon.min_history <= mon.window,
         "monitor.min_history: must be between 1 and monitor.window (window >= 3); fix one of them")
    need(mon.hang_floor_s > 0 and mon.hang_factor > 1, "monitor.hang_floor_s: must be > 0 and monitor.hang_factor > 1; raise them")
    need(mon.rss_every_steps >= 0 and mon.leak_window >= 3 and mon.leak_mb_per_step >= 0,
         "monitor.rss_every_steps: must be >= 0, monitor.leak_window >= 3 and monitor.leak_mb_per_step >= 0 "
         "(0 disables); fix the value")
    need(mon.max_rollbacks >= 0 and mon.rollback_skip_batches >= 0 and 0 < mon.rollback_lr_factor <= 1,
         "monitor.max_rollbacks: it and monitor.rollback_skip_batches must be >= 0, "
         "monitor.rollback_lr_factor in (0, 1]; fix the value")
    need(k.backend in ("auto", "gloo", "nccl"), f"cluster.backend: {k.backend!r}; use auto, gloo or nccl")
    need(k.collective_timeout_s > 0, f"cluster.collective_timeout_s: {k.collective_timeout_s}; set it > 0")
    need(cfg.tracking.mode in TRACKING_MODES,
         f"tracking.mode: {cfg.tracking.mode!r} unknown; use one of {', '.join(TRACKING_MODES)}")
    need(cfg.run.baseline is None or _safe_name(cfg.run.baseline),
         f"run.baseline: {cfg.run.baseline!r} is not a plain name; use the baseline run's name")
    e = cfg.eval
    need(e.every_steps >= 0, f"eval.every_steps: {e.every_steps}; set it >= 0 (0 = off)")
    need(d.val_samples >= 1, f"data.val_samples: {d.val_samples}; set it to 1 or more")
    need(e.task_samples >= 0 and e.predictions >= 0, "eval.task_samples: task_samples and predictions must be >= 0; raise them")
    need(t.pause_at_step >= 0, f"train.pause_at_step: {t.pause_at_step}; set it >= 0 (0 = never)")
    p += validate_sweep(cfg.sweep, k)
    return p


def validate_sweep(s: SweepConfig, cluster: ClusterConfig) -> list[str]:
    """The sweep keys' own problems; what depends on the search space is checked by the sweep."""
    p: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            p.append(msg)

    need(s.name is None or _safe_name(s.name),
         f"sweep.name: {s.name!r} is not a plain name; use letters, digits, '.', '_', '-'")
    need(s.sampler in SAMPLERS, f"sweep.sampler: {s.sampler!r} unknown; use one of {', '.join(SAMPLERS)}")
    need(s.pruner in PRUNERS, f"sweep.pruner: {s.pruner!r} unknown; use one of {', '.join(PRUNERS)}")
    need(s.scheduler in SCHEDULERS, f"sweep.scheduler: {s.scheduler!r} unknown; use one of {', '.join(SCHEDULERS)}")
    need(s.scheduler == "none" or s.pruner == "none",
         f"sweep.pruner: {s.pruner} cannot be combined with sweep.scheduler={s.scheduler}, which decides the "
         f"stops itself; set sweep.pruner=none")
    need(s.trials >= 0, f"sweep.trials: {s.trials}; set the number of trials to run")
    need(s.parallel >= 1, f"sweep.parallel: {s.parallel}; set it to 1 or more")
    need(s.budget_steps >= 0, f"sweep.budget_steps: {s.budget_steps}; set it >= 0 (0 = no limit)")
    need(bool(s.metric), "sweep.metric: empty; name a column of metrics.jsonl, e.g. val_loss")
    need(s.direction in ("minimize", "maximize"), f"sweep.direction: {s.direction!r}; use minimize or maximize")
    need(s.startup_trials >= 0 and s.prune_after_steps >= 0 and s.min_steps >= 0 and s.interval_steps >= 0,
         "sweep.startup_trials: it, sweep.prune_after_steps, sweep.min_steps and sweep.interval_steps must be "
         ">= 0; fix the value")
    need(s.reduction_factor >= 2, f"sweep.reduction_factor: {s.reduction_factor}; set it to 2 or more")
    need(0 < s.quantile <= 0.5, f"sweep.quantile: {s.quantile}; set it within (0, 0.5]")
    need(0 <= s.resample_probability <= 1, f"sweep.resample_probability: {s.resample_probability}; set it within [0, 1]")
    need(bool(s.perturb_factors) and all(f > 0 for f in s.perturb_factors),
         f"sweep.perturb_factors: {s.perturb_factors}; give one or more factors > 0, e.g. [0.8,1.2]")
    need(s.controller in ("here", "slurm"), f"sweep.controller: {s.controller!r}; use here or slurm")
    need(s.controller != "slurm" or cluster.kind == "slurm",
         "sweep.controller: slurm runs the controller as a Slurm job, so its trials must be Slurm jobs too; add "
         "cluster=slurm")
    need(s.controller_time_min >= 2, f"sweep.controller_time_min: {s.controller_time_min}; set it to 2 or more")
    need(s.poll_s > 0, f"sweep.poll_s: {s.poll_s}; set it > 0")
    return p


def validate_allocation(cfg: Config) -> list[str]:
    """Spare nodes and elastic shrinking: Slurm only, and the global batch must divide at every
    world size the run may shrink to."""
    k, d = cfg.cluster, cfg.data
    p: list[str] = []
    if k.spare_nodes < 0:
        p.append(f"cluster.spare_nodes: {k.spare_nodes}; set it >= 0")
    if not 0 <= k.elastic.min_nodes <= k.nodes:
        p.append(f"cluster.elastic.min_nodes: {k.elastic.min_nodes} is not between 1 and cluster.nodes={k.nodes}; "
                 f"set it within that range (0 turns shrinking off)")
    if p or not driven(k):
        return p
    if k.kind != "slurm":
        p.append("cluster.spare_nodes: spare nodes and elastic.min_nodes need a Slurm allocation; add cluster=slurm "
                 "or set cluster.spare_nodes=0 cluster.elastic.min_nodes=0")
    bad = [n for n in range(min_nodes(k), k.nodes + 1)
           if d.global_batch_size % max(d.micro_batch_size * n * k.tasks_per_node, 1)]
    if bad:
        p.append(f"cluster.elastic.min_nodes: data.global_batch_size={d.global_batch_size} is not a multiple of "
                 f"micro_batch_size*ranks at {', '.join(map(str, bad))} node(s), which the run may shrink to; raise "
                 f"min_nodes or choose a global batch that every world size from {min_nodes(k)} to {k.nodes} nodes "
                 f"divides")
    return p


def world_size(cluster: ClusterConfig) -> int:
    """Ranks a run of this config has."""
    return cluster.ranks if cluster.kind == "local" else cluster.nodes * cluster.tasks_per_node


def min_nodes(cluster: ClusterConfig) -> int:
    """Fewest nodes the run may continue on inside its allocation."""
    return cluster.elastic.min_nodes or cluster.nodes


def driven(cluster: ClusterConfig) -> bool:
    """The job's driver runs training as job steps and restarts it inside the allocation."""
    return cluster.spare_nodes > 0 or cluster.elastic.min_nodes > 0


def _safe_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and all(ch.isalnum() or ch in "._-" for ch in name)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """`{"optim.lr": 1e-4, ...}` from a typed config or nested dict (for diffs and names)."""
    if is_dataclass(obj):
        obj = {f.name: getattr(obj, f.name) for f in fields(obj)}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: obj}
