"""resilient_slurm: keeps long training runs alive on Slurm.

Floors, from the ground up; a module imports only from its own floor or the ones below it
(tests/test_static_checks.py holds the order and enforces it):
    exit_codes   process exit statuses and what each asks of the launcher or Slurm
    files        atomic replace of small files, the one UTC time stamp
    console      progress on long work (one line per update off a terminal), output piped into head
    config/      typed configuration (the dataclasses Hydra fills) and its validation
    ledger       events.jsonl: the catalog of event kinds and their fields, writer and reader
    recovery     what to do about what went wrong: requeue, exclude, roll back, give up  [pure]
    slurm/       adapters to Slurm: its environment, scontrol, srun's reports, placement
    rundir/      a run directory: its files, identity, run.json, metrics and record writers
    health/      node health: the Xid scanner (tools/xid_scan), NVML checks, exclude list
    monitor/     in-training fault detection and the GPU sampler
    tracking/    wandb or MLflow, one run across restarts
    analysis/    readers: goodput, report, compare, plots
    checkpoint/  atomic sharded checkpoints, tiers, resume, verify
    model/       the decoder, pretrained weights, LoRA, FSDP2
    data/        tokenizers, packed rows, the exact-position sampler; chat/, tokens/ (pretraining)
    export/      a checkpoint as a Hugging Face (or PEFT) directory
    runtime/     one rank's training loop: step, optimizer, evaluation, signals, watchdog
    supervise/   what watches ranks from outside: the local launcher, Slurm task and driver
    launch/      command line → run directory → local run or Slurm submission
    sweep/       hyperparameter search, each trial an ordinary run
    simulate/    a long run at scale, decided by the project's own code
    report, compare   the `python -m` commands of analysis/

Kept import-free on purpose: `tools/xid_scan` imports `resilient_slurm.health` from a bare
Prolog/Epilog environment and must not pay for torch or Hydra.
"""
