"""`sweep.*`: the hyperparameter search's own keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import safe_name

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "halving", "hyperband")
SCHEDULERS = ("none", "asha", "pbt")


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

    def problems(self, cluster_kind: str) -> list[str]:
        """The sweep keys' own problems; what depends on the search space is checked by the sweep."""
        s = self
        p: list[str] = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                p.append(msg)

        need(s.name is None or safe_name(s.name),
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
        need(s.controller != "slurm" or cluster_kind == "slurm",
             "sweep.controller: slurm runs the controller as a Slurm job, so its trials must be Slurm jobs too; add "
             "cluster=slurm")
        need(s.controller_time_min >= 2, f"sweep.controller_time_min: {s.controller_time_min}; set it to 2 or more")
        need(s.poll_s > 0, f"sweep.poll_s: {s.poll_s}; set it > 0")
        return p
