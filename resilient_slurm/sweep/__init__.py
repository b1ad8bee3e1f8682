"""Hyperparameter search: grid, random, Bayesian (Optuna TPE) with pruning, ASHA and PBT, each trial
an ordinary run (its own run directory, ledger, wandb run and requeue) launched by one controller.

Modules, from the command to the study:
    __main__     `python -m resilient_slurm.sweep`: parse, then run the controller here or submit it
    cli          the command: search arguments apart, the config composed, every problem at once
    space        the search space in Hydra's override grammar; grid points                    [pure]
    study        the study directory, its spec, and the Optuna study on a journal file
    session      one controller session: lock, study, controller, leaderboard, plots
    remote       sweep.controller=slurm: the controller as a requeueable Slurm job
    controller   the only writer of a study: ask, launch, report new steps, prune, tell, recover
    replay       where each trial stood, from the study's ledger (for a restart)             [pure]
    schedules    what to launch next: sampling, ASHA promotions, PBT generations
    asha         ASHA rungs and promotions                                                  [pure]
    pbt          PBT generations: exploit (who copies whom) and explore (new values)        [pure]
    feed         a trial's objective from metrics.jsonl: unread steps, values, compute      [pure]
    outcome      how a trial's launch ended, from its ledger                                [pure]
    launcher     a trial's config, run directory and start, recorded in both ledgers
    backends     local processes or Slurm jobs: start, watch, cancel, re-attach
    exploit      PBT's checkpoint copy, the donor's checkpoint pinned until it is committed
    leaderboard  leaderboard.csv and the printed table
    plots        history, slices, importance and PBT lineage PNGs (matplotlib, lazily)
"""
