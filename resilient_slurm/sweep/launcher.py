"""A trial's run: its config (the command's config and the trial's values), its run directory, and
its start on a backend, recorded in the run's ledger and the study's.

The controller prepares every trial's run directory itself (`launch/prepare`), so a value
that does not validate fails the trial before anything is submitted, and PBT's explore step can
pass the one change a relaunch is allowed to make.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_slurm.rundir import RunDir
from resilient_slurm.config import Adjustment, Config, explicit_keys, to_config
from resilient_slurm.launch.prepare import AllowedChange, prepare
from resilient_slurm.ledger import ConfigAdjusted, EventLog, TrialLaunched
from resilient_slurm.sweep.backends import Backend, Handle
from resilient_slurm.sweep.space import override


@dataclass(frozen=True)
class Launch:
    run_dir: Path
    handle: Handle


class TrialLauncher:
    def __init__(self, base: Mapping[str, Any], overrides: list[str], study: str, backend: Backend,
                 study_log: EventLog) -> None:
        """`base`: the command's composed config as a plain dict; `overrides`: its plain overrides."""
        self.base = base
        self.overrides = overrides
        self.study = study
        self.backend = backend
        self.study_log = study_log

    def run_name(self, number: int) -> str:
        return f"{self.study}-{number:03d}"

    def config(self, number: int, params: Mapping[str, Any], pause_at: int) -> tuple[Config, list[str],
                                                                                      list[Adjustment]]:
        """The trial's typed config, the overrides that spell it, and what validation adjusted;
        raises ConfigError naming every problem."""
        tree = copy.deepcopy(dict(self.base))
        # The controller watches the job itself: a submission must not block on it (cluster.wait).
        settings = {"run.name": self.run_name(number), "sweep.name": self.study, "train.pause_at_step": pause_at,
                    "cluster.wait": False, **params}
        for key, value in settings.items():
            _set(tree, key, value)
        spelled = self.overrides + [override(k, v) for k, v in settings.items()]
        adjustments: list[Adjustment] = []
        cfg = to_config(tree, explicit_keys(spelled), adjustments)
        return cfg, spelled, adjustments

    def launch(self, number: int, params: Mapping[str, Any], target: int, max_steps: int, why: str,
               allow: AllowedChange | None = None) -> Launch:
        """Prepare the run directory (raises ConfigError) and start the trial; it runs to `target`."""
        cfg, spelled, adjustments = self.config(number, params, target if target < max_steps else 0)
        run_dir, _ = prepare(cfg, spelled, allow=allow)
        run_log = EventLog(RunDir(run_dir).events, rank=-1)
        for a in adjustments:
            run_log.emit(ConfigAdjusted(key=a.key, old=a.old, new=a.new, why=a.why), None)
        handle = self.backend.start(cfg, run_dir)
        event = TrialLaunched(trial=number, run=run_dir.name, target_step=target, why=why, params=dict(params),
                              job=handle.job, pid=handle.pid)
        run_log.emit(event, None)
        self.study_log.emit(event, None)
        return Launch(run_dir, handle)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
