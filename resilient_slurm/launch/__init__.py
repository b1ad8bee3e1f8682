"""Launching a run: from the command line to a run directory and a running job.

`python -m resilient_slurm.launch` is `__main__.py`. Modules, in the order a launch uses them:
    __main__   checks → Hydra composes conf/ → typed Config → run directory → local run or Slurm job
    command    the command line: -m, --config-dir, --plan, --help and the overrides         [pure]
    help       --help: experiments, groups and keys, each key's doc read from config/*.py
    extras     the optional packages a config needs (lm-eval, MLflow, s3fs), refused when missing
    plan_report  --plan: layout, memory per GPU, batch, checkpoint bytes, collectives       [pure]
    naming     run names {model}-{task}-{date}-{variant} and ablation groups                [pure]
    prepare    the run directory: created once, re-opened to resume, a changed identity refused
               once the run has trained; a finished run found
    submit     cluster=slurm: the submitit executor, the exclude list as --exclude
"""
