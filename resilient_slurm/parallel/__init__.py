"""How a run's model is laid out over its ranks: the device mesh from `parallel.*`, tensor
parallelism, and FSDP2 over its data-parallel part (HSDP when there are replicas).

Modules:
    mesh     the N-D device mesh from the run's Layout (config/parallel.py), its views, this rank's place
    tp       tensor parallelism: the DTensor plans (sequence-parallel norms, vocabulary-parallel
             embedding and head, LoRA adapters sharded like their base), per family
    fsdp     the model built on the meta device, TP, compiled blocks, FSDP2; each rank fills its box
    clip     gradient clipping by the global norm over every mesh (and pipeline stage)
"""
