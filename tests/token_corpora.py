"""Small token corpora for the token pipeline's tests: Megatron pairs of random documents written
by our writer, tokens-pipeline configs over them, and .jsonl text."""

import json

import numpy as np

from resilient_slurm.config import Config, DataConfig, SourceConfig
from resilient_slurm.data.tokens.idx_writer import IdxWriter


def write_prefix(prefix, docs, dtype="uint16"):
    """A Megatron pair of these documents, written by our writer."""
    w = IdxWriter(f"{prefix}.bin", f"{prefix}.idx", dtype)
    w.add(np.concatenate(docs) if docs else np.empty(0, dtype), np.array([len(d) for d in docs]))
    w.finish()
    return str(prefix)


def numbered_docs(count, seed, low=5, high=40, eos=1, vocab=400):
    """Documents of random tokens (>= 2) ending in `eos`."""
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(2, vocab, rng.integers(low, high)), eos).astype(np.int64) for _ in range(count)]


def token_config(sources, **data):
    """A tokens-pipeline Config over `sources` = [(name, path, weight)]."""
    cfg = Config()
    defaults = dict(kind="tokens", tokenizer="", seq_len=16, global_batch_size=8, micro_batch_size=1,
                    val_sequences=4)
    defaults.update(data)
    cfg.data = DataConfig(sources=[SourceConfig(n, p, w) for n, p, w in sources], **defaults)
    cfg.train.max_steps = 20
    return cfg


def two_sources(root):
    """Two Megatron sources of random documents: web (~6k tokens), code (~3k tokens)."""
    web = write_prefix(root / "web", numbered_docs(260, 1))
    code = write_prefix(root / "code", numbered_docs(130, 2))
    return [("web", web, 0.7), ("code", code, 0.3)]


def write_jsonl(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return str(path)
