"""How a run's model is laid out over its ranks: the device mesh from `parallel.*`, tensor
parallelism, FSDP2 over its data-parallel part (HSDP when there are replicas), and the pipeline
stages.

Modules:
    mesh       the N-D device mesh from the run's Layout (config/parallel.py), its views, this rank's place
    tp         tensor parallelism: the DTensor plans (sequence-parallel norms, vocabulary-parallel
               embedding and head, LoRA adapters sharded like their base), per family
    fsdp       the model built on the meta device, TP, compiled blocks, FSDP2; each rank fills its box
    clip       gradient clipping by the global norm over every mesh (and pipeline stage)
    pipeline   this rank's pipeline stages (cut by config/parallel.py), their schedules, tied embeddings
    estimate   what a run holds and moves per rank, from its config: `launch --plan`     [pure]
"""
