"""`python -m resilient_slurm.launch +experiment=NAME [key=value ...]`: compose, validate, run.

Hydra composes `conf/`; the result is converted once to the typed `Config`; the run directory is
created (or re-opened to resume); then the run executes here (`cluster=local`) or is submitted
to Slurm (`cluster=slurm`), one job per point of a `-m` sweep.
"""

from __future__ import annotations

import os
import sys

from resilient_slurm.runtime.threads import yield_when_idle

yield_when_idle(os.environ)  # before anything imports torch: OpenMP reads it when it loads

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from resilient_slurm.rundir import RunDir
from resilient_slurm.config import Adjustment, ConfigError, explicit_keys, register_schema, to_config
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.prepare import prepare
from resilient_slurm.supervise.local import run_local
from resilient_slurm.launch.submit import submit
from resilient_slurm.ledger import ConfigAdjusted, EventLog
from resilient_slurm.model.pretrained import apply_pretrained

register_schema()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    overrides = list(HydraConfig.get().overrides.task)
    adjustments: list[Adjustment] = []
    try:
        cfg = to_config(dict_cfg, explicit_keys(overrides), adjustments, resolve_model=apply_pretrained)
        run_dir, resumed = prepare(cfg, overrides)
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"resilient_slurm: config error: {line}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    for a in adjustments:
        print(f"resilient_slurm: {a}", file=sys.stderr)
        EventLog(RunDir(run_dir).events, rank=-1).emit(ConfigAdjusted(key=a.key, old=a.old, new=a.new, why=a.why),
                                                          None)
    if cfg.cluster.kind == "slurm":
        if cfg.cluster.submit:
            submit(cfg, run_dir)
        else:
            print(run_dir)
        return
    print(f"resilient_slurm: {'resuming' if resumed else 'starting'} run {run_dir}", flush=True)
    code = run_local(cfg, run_dir)
    # In a sweep (-m), one point's status must not end the others.
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(code)


if __name__ == "__main__":
    main()
