"""What the runtime trains: the model and the data.

Modules, from files to batches:
    model          a Llama-architecture decoder with Hugging Face parameter names, packed inputs
    pretrained     a Hugging Face Llama directory: config.json → ModelConfig, weights read by row ranges
    lora           LoRA adapters on a frozen base: the layer, where it goes, its initial values
    tokenizer      a Hugging Face directory's tokenizer.json, special tokens, EOS ids and chat template
    chat_template  chat templates rendered in jinja2's sandbox as transformers renders them
    chat_format    one .jsonl line → messages (`messages` or `prompt`/`completion`), or why not  [pure]
    chat_encode    a conversation → token ids, loss mask and its last reply, via assistant spans
    packing        documents packed into rows; labels and positions of a row                    [pure]
    chat_cache     data fingerprints, the cache key, an entry built once when all ranks start
    chat_build     .jsonl files → held-out split, tokenized, packed rows in a cache entry
    chat_data      open chat data for a run (cache hit or build): rows, eval samples, stats
    batches        the Batch of packed rows and the exact-position sampler over them
    tiny_chat      the small chat task set and Llama-3-style template the package ships         [pure]

Files: assets/tiny_chat/ holds that set with its tokenizer (tools/make_tiny_chat writes it).
"""
