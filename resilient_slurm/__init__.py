"""resilient_slurm: keeps long training runs alive on Slurm.

The shared contracts sit here; each sub-package serves one side of a run, in the order a run flows:
    config      typed configuration (the dataclasses Hydra fills) and its validation
    ledger      events.jsonl: the catalog of event kinds and their fields, writer and reader
    exit_codes  process exit statuses and what each asks of the launcher or Slurm
    recovery    what to do about what went wrong: requeue, exclude, roll back, give up  [pure]
    report, compare   the `python -m` commands of analysis/

    launch/      command line → run directory → local run or Slurm submission
    slurm/       inside a Slurm job: each task's entry, node-health watch, scontrol
    runtime/     one rank's training loop: step, optimizer, evaluation, signals, watchdog
    workload/    the model and the data it trains on
    data/        pretraining token data (tokens/) and its commands: tokenize, prepare
    checkpoint/  atomic sharded checkpoints, tiers, resume, verify
    monitor/     in-training fault detection and the GPU sampler
    health/      node health: the Xid scanner (tools/xid_scan), NVML checks, exclude list
    tracking/    wandb, one run across restarts
    analysis/    record, metrics, goodput, report, compare

Kept import-free on purpose: `tools/xid_scan` imports `resilient_slurm.health` from a bare
Prolog/Epilog environment and must not pay for torch or Hydra.
"""
