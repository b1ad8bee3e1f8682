"""Launching a run: from the command line to a run directory and a running job.

`python -m resilient_slurm.launch` is `__main__.py`. Modules, in the order a launch uses them:
    __main__   Hydra composes conf/ → typed Config → run directory → local run or Slurm submission
    naming     run names {model}-{task}-{date}-{variant} and ablation groups                [pure]
    prepare    the run directory: created once, re-opened to resume, a changed identity refused
    submit     cluster=slurm: the submitit executor, the exclude list as --exclude
"""
