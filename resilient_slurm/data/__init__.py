"""What a run trains on: tokenizers, packed rows, and the exact-position sampler over them.

Modules, from files to batches:
    tokenizer      a Hugging Face directory's tokenizer.json, special tokens, EOS ids and chat template
    chat_template  chat templates rendered in jinja2's sandbox as transformers renders them
    fingerprint    the data's version: size, mtime and sampled blocks of each file, cheap at any size
    packing        documents packed into rows; labels and positions of a row                    [pure]
    batches        the Batch of packed rows and the exact-position sampler over them
    pipeline       what the trainer trains on: chat rows or a token mixture, and its data position
    open           the data of a run opened for one rank, bad input in one line
    __main__       python -m resilient_slurm.data tokenize | prepare (the CPU-side steps of pretraining)

Sub-packages:
    chat/          chat .jsonl → held-out split, tokenized, packed rows in a cache entry
    tokens/        pretraining on token corpora: Megatron .bin/.idx and token arrays read in place, a
                   weighted mixture in tokens, the order prepared ahead, the data position and phases
"""
