"""The chat pipeline: .jsonl conversations → tokenized, loss-masked, packed rows, cached once.

Modules, from lines to rows:
    format     one .jsonl line → messages (`messages` or `prompt`/`completion`), or why not  [pure]
    encode     a conversation → token ids, loss mask and its last reply, via assistant spans
    split      how many conversations are held out for validation (data.val_samples)     [pure]
    cache      the data files, the cache key, an entry built once when all ranks start
    build      .jsonl files → held-out split, tokenized, packed rows in a cache entry
    dataset    open chat data for a run (cache hit or build): rows, eval samples, stats
    tiny       the small chat task set and Llama-3-style template the package ships         [pure]

Files: assets/tiny_chat/ holds that set with its tokenizer (tools/make_tiny_chat writes it).
"""
