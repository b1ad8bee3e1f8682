"""A trained model written out for its users: a Hugging Face directory that transformers and vLLM load.

Modules:
    hf_layout   what the directory holds, as data: shard plan, index, config.json, generation config  [pure]
    hf_writer   write it shard by shard (memory within one output shard), renamed into place at the end
    from_checkpoint   a checkpoint of the project (the ranks' pieces) read tensor by tensor into hf_writer
    __main__    `python -m resilient_slurm.export RUN_DIR OUT [--step N] [--dtype ...]`
"""
