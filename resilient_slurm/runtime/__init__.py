"""The in-job runtime: one rank's training loop and what it needs around it. Knows nothing of
Hydra or submitit; the Slurm side (`slurm.task`) and the local launcher both call `job.run`.

Modules, from the loop outwards:
    job          one rank's life: resume → steps → saves → stop → hf/ export, with its exit status
    build        what a rank builds first: the chat data, the sharded model with its initial weights
    parallel     FSDP2: the model built on the meta device, sharded, each rank filling its own rows
    step         one optimizer step over the global batch (forward, backward, reduce, clip, update)
    oom          a CUDA OOM on any rank agreed by all (points before FSDP2's collectives), the step freed
    optim        AdamW and the warmup + cosine schedule
    evaluation   validation loss and task metrics on the held-out split
    distributed  process group, rank information and the few collectives the loop uses
    signals      the only caller of signal.signal: stop signals just record a request
    watchdog     a thread that catches a hung step and dumps every rank's stacks
    faults       fault injection for drills and tests (fault.*)
"""
