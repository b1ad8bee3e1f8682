"""Typed configuration: the dataclasses Hydra fills, and their validation.

Every default lives in these dataclasses, once, with its doc beneath it: `register_schema` hands
them to Hydra as the base of `conf/config.yaml`, and `conf/` holds only presets that differ
(experiments, model sizes, checkpoint policies, clusters). `launch` converts Hydra's DictConfig to
these objects once (`to_config`); nothing deeper sees a DictConfig. Validation reports every problem
at once, each as one line naming the key and the fix: each section checks its own keys
(`problems()`), `schema.validate` the ones that span sections.

Modules, one per section, then the whole:
    checks      ConfigError, the problem collector, plain names, flatten                [pure]
    run         run.*: experiments root, run name, fork, baseline, required keys        [pure]
    families    the model families the decoder builds: one catalog, as data             [pure]
    model       model.*: dimensions, pretrained directory, LoRA                         [pure]
    data        data.*: the data, its batches                                           [pure]
    train       optim.* and train.*                                                     [pure]
    checkpoint  checkpoint.*: policies, retention, tiers                                [pure]
    cluster     cluster.*: local ranks or a Slurm allocation, spares, elastic shrinking [pure]
    monitor     monitor.* and health.*                                                  [pure]
    sdc         monitor.sdc.*: the silent-data-corruption sentinel                      [pure]
    tracking    tracking.* and eval.*                                                   [pure]
    harness     eval.harness.*: lm-evaluation-harness benchmarks beside training        [pure]
    faults      fault.*: injection for tests and drills                                 [pure]
    sweep       sweep.*: hyperparameter search                                          [pure]
    parallel    parallel.*: the degrees of HSDP x TP x PP, and the resolved Layout       [pure]
    schema      Config (every section), placement keys, cross-section checks            [pure]
    overrides   command-line overrides checked against the schema and conf/'s groups    [pure]
    compose     Hydra's composed config → typed Config; the schema Hydra starts from
    composer    composing conf/ with Hydra's compose API, its errors in one line (launch, sweep)

Everything is re-exported here: `from resilient_slurm.config import Config, ConfigError, ...`.
"""

from resilient_slurm.config.checkpoint import CheckpointConfig, ColdTierConfig, MemoryTierConfig
from resilient_slurm.config.checks import ConfigError, flatten
from resilient_slurm.config.cluster import (
    ClusterConfig,
    ElasticConfig,
    driven,
    min_nodes,
    world_size,
)
from resilient_slurm.config.compose import (
    Adjustment,
    explicit_keys,
    fit_warmup,
    register_schema,
    to_config,
    to_dict,
)
from resilient_slurm.config.data import LOSS_MODES, DataConfig, SourceConfig
from resilient_slurm.config.faults import FaultConfig
from resilient_slurm.config.harness import HarnessConfig
from resilient_slurm.config.model import DTYPES, FAMILIES, LORA_TARGETS, LoRAConfig, ModelConfig
from resilient_slurm.config.monitor import FINDINGS, FindingKind, HealthConfig, MonitorConfig
from resilient_slurm.config.run import RunConfig
from resilient_slurm.config.sdc import SdcConfig
from resilient_slurm.config.parallel import MESH_DIMS, PP_SCHEDULES, Coords, Layout, ParallelConfig
from resilient_slurm.config.schema import PLACEMENT_PREFIXES, Config, layout, train_steps, validate
from resilient_slurm.config.sweep import PRUNERS, SAMPLERS, SCHEDULERS, SweepConfig
from resilient_slurm.config.tracking import TRACKING_BACKENDS, TRACKING_MODES, EvalConfig, TrackingConfig
from resilient_slurm.config.train import OptimConfig, TrainConfig

__all__ = [
    "DTYPES", "FAMILIES", "MESH_DIMS", "PP_SCHEDULES", "Coords", "Layout", "ParallelConfig", "layout", "FINDINGS", "LORA_TARGETS", "LOSS_MODES", "PLACEMENT_PREFIXES", "PRUNERS", "SAMPLERS", "SCHEDULERS",
    "TRACKING_BACKENDS",
    "TRACKING_MODES", "Adjustment", "CheckpointConfig", "ClusterConfig", "ColdTierConfig", "Config", "ConfigError",
    "DataConfig", "ElasticConfig", "EvalConfig", "FaultConfig", "FindingKind", "HarnessConfig", "HealthConfig", "LoRAConfig", "MemoryTierConfig", "ModelConfig",
    "MonitorConfig", "OptimConfig", "RunConfig", "SdcConfig", "SourceConfig", "SweepConfig", "TrackingConfig", "TrainConfig", "driven",
    "explicit_keys", "fit_warmup", "flatten", "min_nodes", "register_schema", "to_config", "to_dict", "train_steps", "validate",
    "world_size",
]
