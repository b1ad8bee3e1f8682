"""A trained model written out for its users: a Hugging Face directory that transformers and vLLM load,
or for a LoRA run a PEFT adapter directory that peft and vLLM load.

Modules:
    hf_layout   what the directory holds, as data: shard plan, index, config.json, generation config  [pure]
    hf_writer   write it shard by shard (memory within one output shard), renamed into place at the end
    peft_layout what a PEFT LoRA adapter directory holds: file and tensor names, adapter_config.json  [pure]
    adapters    a LoRA run's adapters as a PEFT directory, or merged into its base model (streaming)
    from_checkpoint   a checkpoint (the ranks' pieces) read tensor by tensor: a model, an adapter, a merge
    __main__    `python -m resilient_slurm.export RUN_DIR OUT [--step N] [--dtype ...] [--merge]`
"""
