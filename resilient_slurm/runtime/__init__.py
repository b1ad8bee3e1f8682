"""The in-job runtime: one rank of a run, and the resilience that any training loop gets from it.
Knows nothing of Hydra or submitit; the Slurm side (`supervise.task`) and the local launcher both
call `rank.run`.

Modules, from the rank outwards:
    rank         one rank's life: the built-in trainer or a user's entry=, with its exit status
    rejoin       a survivor of a peer's death waits for the driver's word and goes on in its process
    session      the resilience layer of one rank: agreed stop, saves, resume, ledger, metrics, tracker
    trainer      the built-in trainer, the session's first user: data, model, OOM retry, rollback,
                 evaluation, pause, export
    pipeline     what the trainer trains on: chat rows or a token mixture, and its data position
    entry        a user's own training function (entry=MODULE:FN), run as a rank
    build        what the trainer builds first: the chat data, the sharded model with its initial weights
    step         one optimizer step over the global batch (forward, backward, reduce, clip, update)
    oom          a CUDA OOM on any rank agreed by all (points before FSDP2's collectives), the step freed
    optim        AdamW and the warmup + cosine schedule
    evaluation   validation loss and task metrics on the held-out split
    distributed  process group, rank information and the few collectives the loop uses
    signals      the only caller of signal.signal: stop signals just record a request
    heartbeat    the rank's beats to the monitor outside the training processes (UDP)
    watchdog     a thread that catches a hung step and dumps every rank's stacks
    faults       fault injection for drills and tests (fault.*)
    logs         each rank's log file, and rank 0's stdout
    threads      CPU threads per rank, and OpenMP told to yield instead of spin
"""
