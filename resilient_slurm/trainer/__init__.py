"""The built-in trainer: the Session's first user. The project's model on chat data or a token mixture.

Modules:
    trainer      the loop: data, model, OOM retry, rollback, evaluation, pause, export
    build        what the trainer builds first: the sharded model with its initial weights
    step         one optimizer step over the global batch (forward, backward, reduce, clip, update)
    pipeline_step  the step through pipeline stages (a schedule's forwards and backwards, the norm over stages)
    replicated   its steps across replica groups: a quorum first, the group's share, a step done again
    oom          a CUDA OOM on any rank agreed by all (points before FSDP2's collectives), the step freed
    optim        AdamW and the warmup + cosine schedule
    evaluation   validation loss and task metrics on the held-out split
    faults       fault injection for drills and tests (fault.*)
"""
