"""How a run's model is laid out over its ranks: the device mesh from `parallel.*`, the FSDP2
sharding over its data-parallel part (HSDP when there are replicas), and the pipeline stages.

Modules:
    mesh       the N-D device mesh from the run's Layout (config/parallel.py), its views, this rank's place
    fsdp       FSDP2: the model built on the meta device, sharded, each rank filling its own rows
    pipeline   this rank's pipeline stages (cut by config/parallel.py), their schedules, tied embeddings
"""
