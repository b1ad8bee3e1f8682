"""Pretraining data (`data.kind=tokens`): token corpora read where they lie, mixed by weight in
tokens, in an order that is a pure function of the files, seq_len, seed, weights and epoch.

Modules, from files to batches:
    errors          TokenDataError (bad files or settings: no restart helps), SourceExhausted
    idx_format      the Megatron .idx layout: header, dtype codes, array offsets              [pure]
    corpus          a .bin/.idx prefix or a token array, read with pread; the full scan
    sources         a source's files from its path (prefix, glob, directory), one stream, fingerprint
    plan            the block plan: which source each global position comes from             [pure]
    order           each source's windows: held-out ones and one permutation per epoch, as index files
    position        the data position: one counter, the data phase, resume checks            [pure]
    sampler         global batches at a position, cut into each rank's micro-batches; validation rows
    token_data      open_token_data: everything checked before training, samplers, stats
    records         one .jsonl line or parquet cell → text, or what is wrong with it          [pure]
    text_inputs     reading .jsonl, .jsonl.gz, .jsonl.zst and parquet in order
    progress        the tqdm bar: in place on a terminal, one line per update in a log
    idx_writer      writing a Megatron .bin/.idx pair
    tokenize_files  tokenize: inputs → shards on N processes → one prefix; resumable after a kill
    prepare         prepare: a run's orders built ahead of it (Hydra overrides or plain flags)
    tiny_corpus     the generated corpus of tiny_pretrain: prose and math documents           [pure]
    tiny_pretrain   asset:tiny_pretrain/KIND: that corpus tokenized into the data cache on first use
"""
