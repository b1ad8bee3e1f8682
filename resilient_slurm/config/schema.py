"""The whole config: every section, and the checks that need more than one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.config.checkpoint import CheckpointConfig
from resilient_slurm.config.checks import Problems, flatten
from resilient_slurm.config.cluster import ClusterConfig, driven, min_nodes, world_size
from resilient_slurm.config.data import DataConfig
from resilient_slurm.config.faults import FaultConfig
from resilient_slurm.config.model import ModelConfig
from resilient_slurm.config.monitor import HealthConfig, MonitorConfig
from resilient_slurm.config.parallel import Layout, ParallelConfig, interleaved_problem, resolve
from resilient_slurm.config.run import RunConfig
from resilient_slurm.config.sweep import SweepConfig
from resilient_slurm.config.tracking import EvalConfig, TrackingConfig
from resilient_slurm.config.train import OptimConfig, TrainConfig


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    entry: str = ""
    """A user's own training function, `MODULE:FUNCTION`, run instead of the built-in trainer: it
    gets the composed config and makes an `api.Session`; empty: the built-in trainer."""
    user: dict[str, Any] = field(default_factory=dict)
    """With `entry`: the composed config's top-level keys that are the user's own (a `+my=...`
    group), handed to the function beside the project's."""


# Keys that change where or how a run executes, not what it computes: a relaunch may change them,
# and they are never part of a run's name.
# The micro-batch is one: the loss is normalised by the global batch's token count, so cutting the same
# rows into other micro-batches changes only the order of a sum, as a new world size does. So is the
# layout (parallel.*): every layout trains the same global batches, and checkpoints load at any other.
PLACEMENT_PREFIXES = ("run.", "cluster.", "checkpoint.", "monitor.", "health.", "fault.", "tracking.", "eval.",
                      "train.log_every_steps", "train.threads", "train.pause_at_step", "data.cache_dir", "sweep.",
                      "data.micro_batch_size", "parallel.")


DATA_LOCATION = ("data.path", "data.sources", "data.tokenizer")
"""Where the data lives: what a plan (`launch --plan`) does without, as it reads no data."""


def validate(cfg: Config, data_location: bool = True) -> list[str]:
    """Every semantic problem, each one line: `key: what is wrong; fix`; at most one per key.
    `data_location=False` (a plan): where the data lives is not asked for."""
    p = Problems()
    p.extend_new(requirements(cfg, data_location))
    if p:
        return p  # without what the recipe needs (its model, its data) the other checks would mislead
    m, d, o, t = cfg.model, cfg.data, cfg.optim, cfg.train
    p.extend_new(cfg.run.problems())
    p.extend_new(m.problems())
    p.need(d.seq_len <= m.max_seq_len,
           f"data.seq_len: {d.seq_len} exceeds model.max_seq_len={m.max_seq_len}; lower it or raise max_seq_len")
    p.need(m.sliding_window is None or d.seq_len <= m.sliding_window,
           f"data.seq_len: {d.seq_len} is longer than the model's sliding_window={m.sliding_window} "
           f"({m.pretrained or 'model.sliding_window'}), and the decoder attends over the whole row; lower "
           f"data.seq_len to {m.sliding_window} or less")
    p.extend_new([q for q in d.problems() if data_location or not q.startswith(DATA_LOCATION)])
    # A recipe that requires its model's directory says so already; its tokenizer comes from there.
    model_dir = m.pretrained or (m.config if d.kind == "tokens" else None)
    p.need(bool(d.tokenizer or model_dir) or bool({"model.pretrained", "model.config"} & set(cfg.run.require))
           or not data_location,
           "data.tokenizer: empty and model.pretrained is not set; set one of them to a Hugging Face directory "
           "with tokenizer.json and a chat template")
    p.extend_new(cfg.parallel.problems())
    laid_out = layout(cfg) if not p else None
    if isinstance(laid_out, str):
        p.need(False, laid_out)
    elif laid_out is not None:
        p.extend_new(layout_problems(cfg, laid_out))
        p.extend_new(sdc_problems(cfg, laid_out))
    p.extend_new(o.problems())
    steps = train_steps(cfg)
    p.extend_new(t.problems())  # a run length below 1 is the mistake, not the warmup that does not fit it
    p.need(0 <= o.warmup_steps < max(steps, 1) or steps < 1,
           f"optim.warmup_steps: {o.warmup_steps} must be below {budget(t, steps)}; lower it or raise "
           f"{'train.max_tokens' if t.max_tokens > 0 else 'train.max_steps'}")
    p.extend_new(cfg.checkpoint.problems())
    p.extend_new(cfg.cluster.problems())
    p.extend_new(replica_problems(cfg))
    p.extend_new(shrinkable(cfg))
    p.extend_new(timeouts(cfg))
    for section in (cfg.health, cfg.monitor, cfg.tracking, cfg.eval):
        p.extend_new(section.problems())
    p += cfg.sweep.problems(cfg.cluster.kind)
    return p


def train_steps(cfg: Config) -> int:
    """Optimizer steps of the run: train.max_steps, or train.max_tokens in whole global batches
    (rounded up, so the budget is met; every step trains global_batch_size * seq_len tokens)."""
    t, d = cfg.train, cfg.data
    if t.max_tokens <= 0:
        return t.max_steps
    return -(-t.max_tokens // max(d.global_batch_size * d.seq_len, 1))


def layout(cfg: Config) -> Layout | str:
    """The run's parallel layout at its configured world size, or the one-line problem with it."""
    return resolve(cfg.parallel, world_size(cfg.cluster))


def ranks_per_node(cluster: ClusterConfig) -> int:
    return cluster.ranks if cluster.kind == "local" else cluster.tasks_per_node


def layout_problems(cfg: Config, lay: Layout) -> list[str]:
    """What the model, the data and the nodes must allow of a layout: TP inside a node and dividing
    the heads (GQA with fewer KV heads than TP ranks is refused, as torchtitan does: replicating KV
    heads would change the checkpoint's shapes per TP degree), the sequence split by sequence
    parallelism, a stage per layer at least, whole micro-batches for every data-parallel group, as
    many as the stages (and the rounds an interleaved schedule cuts them into), and no decoding
    evaluation through a pipeline."""
    m, d, par = cfg.model, cfg.data, cfg.parallel
    p = Problems()
    node = ranks_per_node(cfg.cluster)
    p.need(node % lay.tp == 0,
           f"parallel.tp: {lay.tp} does not fit inside a node of {node} rank(s): tensor parallelism exchanges "
           f"activations every layer and must stay on a node's links; use a tp that divides {node}")
    p.need(m.num_heads % lay.tp == 0 and m.num_kv_heads % lay.tp == 0,
           f"parallel.tp: {lay.tp} does not divide the model's {m.num_heads} attention heads and {m.num_kv_heads} "
           f"key/value heads; use a tp that divides both (at most {m.num_kv_heads})")
    p.need(d.seq_len % lay.tp == 0,
           f"parallel.tp: {lay.tp} does not divide data.seq_len={d.seq_len} (sequence parallelism splits each "
           f"sequence over the TP ranks); use a seq_len that tp divides")
    p.need(lay.tp == 1 or m.lora.rank is None or m.lora.dropout == 0,
           f"model.lora.dropout: {m.lora.dropout} under parallel.tp={lay.tp}: the TP ranks of a group would draw "
           f"different dropout masks for the same rows; set model.lora.dropout=0 or parallel.tp=1")
    stages = lay.pp * par.stages_per_rank
    p.need(stages <= m.num_layers,
           f"parallel.pp: {stages} pipeline stage(s) for {m.num_layers} layer(s); every stage needs a layer: "
           f"lower parallel.pp{' or parallel.pp_virtual_stages' if par.stages_per_rank > 1 else ''}")
    per_step = d.micro_batch_size * lay.dp
    p.need(d.global_batch_size % max(per_step, 1) == 0,
           f"data.global_batch_size: {d.global_batch_size} is not a multiple of micro_batch_size*data-parallel "
           f"ranks={d.micro_batch_size}*{lay.dp}={per_step}; change one of them")
    micro_batches = d.global_batch_size // max(per_step, 1)
    p.need(lay.pp == 1 or micro_batches >= lay.pp,
           f"parallel.pp: {lay.pp} stages need at least {lay.pp} micro-batches per step, and a step has "
           f"{micro_batches} (global_batch_size / (micro_batch_size * {lay.dp} data-parallel ranks)); raise "
           f"data.global_batch_size or lower data.micro_batch_size")
    interleaved = interleaved_problem(micro_batches, lay.pp) if lay.pp > 1 and micro_batches >= lay.pp and \
        par.pp_schedule == "interleaved_1f1b" else None
    if interleaved:
        p.need(False, interleaved)
    e = cfg.eval
    p.need(lay.pp == 1 or not e.every_steps or not e.task_samples or d.kind == "tokens",
           f"eval.task_samples: {e.task_samples} with parallel.pp={lay.pp}; greedy decoding through a pipeline "
           f"(each new token back from the last stage to the first) is not built, only the validation loss is; "
           f"set eval.task_samples=0, or parallel.pp=1")
    return p


def sdc_problems(cfg: Config, lay: Layout) -> list[str]:
    """The sentinel's keys against the layout: the buddy re-run is for runs without replicas (with
    them the replicas are compared every step), and the injected flip lands on a rank of the run."""
    s, f = cfg.monitor.sdc, cfg.fault
    p = Problems()
    p.need(s.rerun_every_steps == 0 or lay.dp_replicate == 1,
           f"monitor.sdc.rerun_every_steps: {s.rerun_every_steps} with parallel.dp_replicate={lay.dp_replicate}: "
           f"the replicas are compared every monitor.sdc.every_steps already; set it to 0")
    p.need(s.rerun_every_steps == 0 or lay.world_size >= 2,
           f"monitor.sdc.rerun_every_steps: {s.rerun_every_steps} on one rank: a buddy re-runs the update on "
           f"another rank; run 2 or more ranks, or set it to 0")
    p.need(f.sdc_step >= 0, f"fault.sdc_step: {f.sdc_step}; set it to a step (0: no flip)")
    p.need(f.sdc_step == 0 or 0 <= f.sdc_rank < lay.world_size,
           f"fault.sdc_rank: {f.sdc_rank} is not one of the run's {lay.world_size} rank(s); set it from 0 to "
           f"{lay.world_size - 1}")
    return p


def budget(t: TrainConfig, steps: int) -> str:
    """The run's length as the user set it, for messages."""
    return f"train.max_tokens={t.max_tokens} ({steps} steps)" if t.max_tokens > 0 else f"train.max_steps={steps}"


def requirements(cfg: Config, data_location: bool = True) -> list[str]:
    """What a run cannot start without: an experiments root, and every key its recipe requires
    (`data_location=False`: but the data's location)."""
    p = Problems()
    p.need(bool(cfg.run.root), "run.root: empty; set it to the experiments directory")
    values = flatten(cfg)
    for key in cfg.run.require:
        if not data_location and key.startswith(DATA_LOCATION):
            continue
        p.need(key in values and values[key] not in (None, ""),
               f"{key}: +experiment={cfg.run.experiment} needs it; set {key}=..." if key in values
               else f"run.require: {key!r} is not a config key; fix the recipe")
    return p


def timeouts(cfg: Config) -> list[str]:
    """The timeout hierarchy: a hang is found by its heartbeat before the collectives time out, and a
    collective times out before the Slurm warning's lead runs out. Each level only where it exists:
    heartbeats where a monitor watches the ranks (several local ranks, a Slurm job's driver)."""
    k, m = cfg.cluster, cfg.monitor
    p = Problems()
    watched = m.heartbeat_timeout_s > 0 and (k.ranks > 1 if k.kind == "local" else driven(k))
    p.need(not watched or m.heartbeat_timeout_s < k.collective_timeout_s,
           f"monitor.heartbeat_timeout_s: {m.heartbeat_timeout_s:g} s is not below cluster.collective_timeout_s="
           f"{k.collective_timeout_s:g} s, so a hang would be found by the collectives' timeout first; lower it (or "
           f"raise the collective timeout)")
    p.need(k.kind != "slurm" or k.collective_timeout_s < k.signal_lead_s,
           f"cluster.collective_timeout_s: {k.collective_timeout_s:g} s is not below cluster.signal_lead_s="
           f"{k.signal_lead_s} s, so a collective stuck at the time-limit warning could outlast it and the job be "
           f"killed before its emergency save; lower it (or raise the signal lead)")
    return p


def replica_problems(cfg: Config) -> list[str]:
    """`cluster.replica_ft`: replica groups to fail over between, at least `replica_min` of them, the
    built-in trainer (it moves a lost group's micro-batches to the live ones), no pipeline stages
    (not built across groups), and, with Slurm, whole nodes per
    group (a group's job step runs on its own nodes)."""
    k, par = cfg.cluster, cfg.parallel
    p = Problems()
    if not k.replica_ft:
        return p
    p.need(par.dp_replicate >= 2,
           f"cluster.replica_ft: needs parallel.dp_replicate >= 2 (replica groups to fail over between), and it is "
           f"{par.dp_replicate}; set parallel.dp_replicate=2 or more, or cluster.replica_ft=false")
    p.need(k.replica_min <= par.dp_replicate,
           f"cluster.replica_min: {k.replica_min} is above parallel.dp_replicate={par.dp_replicate}, so no quorum could "
           f"ever form; set it between 1 and {par.dp_replicate}")
    p.need(not cfg.entry,
           "cluster.replica_ft: needs the built-in trainer, which gives a lost group's micro-batches to the live "
           "groups; a user's loop (entry=) cannot; set cluster.replica_ft=false")
    p.need(par.pp == 1,
           f"cluster.replica_ft: not with pipeline parallelism yet (parallel.pp={par.pp}); set parallel.pp=1 or "
           f"cluster.replica_ft=false")
    p.need(k.kind != "slurm" or k.nodes % max(par.dp_replicate, 1) == 0,
           f"cluster.nodes: {k.nodes} node(s) do not split into parallel.dp_replicate={par.dp_replicate} replica groups "
           f"of whole nodes (each group is a job step of its own); use a multiple of {par.dp_replicate} nodes")
    return p


def shrinkable(cfg: Config) -> list[str]:
    """A run that may shrink inside its allocation: at every world size it may shrink to, the layout
    must resolve (an elastic shrink drops whole data-parallel groups: the other degrees stay), the
    global batch must divide over the data-parallel groups left, and an interleaved pipeline's rounds
    must divide the micro-batches (checked only once the allocation's own keys are right)."""
    k, d, par = cfg.cluster, cfg.data, cfg.parallel
    if not driven(k) or k.spare_nodes < 0 or not 0 <= k.elastic.min_nodes <= k.nodes:
        return []
    sizes = range(min_nodes(k), k.nodes + 1)
    laid = {n: resolve(par, n * k.tasks_per_node) for n in sizes}
    unresolved = [n for n, lay in laid.items() if isinstance(lay, str)]
    if unresolved:
        n = unresolved[0]
        return [f"cluster.elastic.min_nodes: at {n} node(s), which the run may shrink to, {laid[n]}; raise "
                f"min_nodes to a node count whose ranks the fixed degrees divide, or set cluster.elastic.min_nodes="
                f"{k.nodes} (no shrinking)"]
    dp = {n: lay.dp for n, lay in laid.items() if not isinstance(lay, str)}
    bad = [n for n in sizes if d.global_batch_size % max(d.micro_batch_size * dp[n], 1)]
    if bad:
        return [f"cluster.elastic.min_nodes: data.global_batch_size={d.global_batch_size} is not a multiple of "
                f"micro_batch_size*data-parallel ranks at {', '.join(map(str, bad))} node(s), which the run may shrink "
                f"to; raise min_nodes or choose a global batch that every world size from {min_nodes(k)} to {k.nodes} "
                f"nodes divides"]
    if par.pp > 1 and par.pp_schedule == "interleaved_1f1b":
        for n in sizes:
            problem = interleaved_problem(d.global_batch_size // max(d.micro_batch_size * dp[n], 1), par.pp)
            if problem:
                return [f"cluster.elastic.min_nodes: at {n} node(s), which the run may shrink to, {problem}"]
    return []
