"""Chat data for a run (`data=chat`): open it (tokenize once, or map the cache), and what training
and evaluation read from it.

    data = open_chat_data(cfg.data, tokenizer_dir, cache_root(cfg), recorded=saved_or_None)
    sampler = PackedBatchSampler(data.train, cfg.data, seed, rank, world)   # batches.py
    data.val.batch(rows)            # validation loss over held-out rows
    data.eval_samples(n)            # exact match: prompt_ids → target_ids
    data.fingerprint.to_record()    # the data's version, for the run record

Every rank calls `open_chat_data` at start: one builds the cache entry, the others wait and map it
(see cache.py). `recorded` is the fingerprint the run stored when it started: a resume
against changed data is refused before anything is tokenized.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from resilient_slurm.config import Config, DataConfig
from resilient_slurm.data.batches import PackedRows
from resilient_slurm.data.chat.build import SPLITS, DataStats, build
from resilient_slurm.data.chat.cache import cache_key, data_files, open_or_build, read_header
from resilient_slurm.data.fingerprint import DataFingerprint, check_unchanged, fingerprint
from resilient_slurm.data.tokenizer import ChatTokenizer, resolve_path


def cache_root(cfg: Config) -> str:
    """data.cache_dir, or `<run.root>/.cache/tokenized` when it is empty."""
    return cfg.data.cache_dir or os.path.join(cfg.run.root, ".cache", "tokenized")


@dataclass(frozen=True)
class EvalSample:
    """A held-out conversation for exact match: generate from `prompt_ids`, compare with `target_ids`."""

    prompt_ids: list[int]
    """The conversation before its last assistant turn, through the assistant header."""
    target_ids: list[int]
    """The last assistant turn's tokens through its first end-of-turn id."""
    prompt: str
    target: str


class ChatData:
    """An opened cache entry: the tokenizer, both splits' rows, the exact-match samples, stats."""

    def __init__(self, tokenizer: ChatTokenizer, entry: str, stats: DataStats, data: DataFingerprint) -> None:
        self.tokenizer = tokenizer
        self.entry = entry
        """The cache entry's directory."""
        self.stats = stats
        self.fingerprint = data
        rows = {split: PackedRows(*(self._load(f"{split}_{part}") for part in ("tokens", "docs", "loss")))
                for split in SPLITS}
        self.train, self.val = rows["train"], rows["val"]
        self._eval = {name: (self._load(name), self._load(f"{name}_offsets"))
                      for name in ("eval_prompt", "eval_target")}

    def eval_samples(self, limit: int | None = None) -> list[EvalSample]:
        """The first `limit` (default all) exact-match samples, in file order."""
        (prompts, p_off), (targets, t_off) = self._eval["eval_prompt"], self._eval["eval_target"]
        count = len(p_off) - 1 if limit is None else min(limit, len(p_off) - 1)
        out = []
        for i in range(count):
            prompt = [int(t) for t in prompts[p_off[i] : p_off[i + 1]]]
            target = [int(t) for t in targets[t_off[i] : t_off[i + 1]]]
            out.append(EvalSample(prompt, target, self.decode(prompt), self.decode(target)))
        return out

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens included (the template's structure stays readable)."""
        return self.tokenizer.decode(ids)

    def _load(self, name: str) -> np.ndarray:
        return np.load(os.path.join(self.entry, f"{name}.npy"), mmap_mode="r")


def open_chat_data(cfg: DataConfig, tokenizer_dir: str, cache_dir: str,
                   recorded: Mapping[str, Any] | None = None,
                   take: Callable[[list[str]], DataFingerprint] = fingerprint) -> ChatData:
    """Map the tokenized data (building it first on a miss). `tokenizer_dir` is a Hugging Face model
    directory (data.tokenizer, else model.pretrained); `recorded` a `DataFingerprint.to_record()`
    saved by the run, checked before anything else (DataChangedError names the changed file).
    `take` fingerprints the files: a run takes it on one rank and shares it with the others."""
    start = time.perf_counter()
    files = data_files(resolve_path(cfg.path))
    data = take(files)
    if recorded is not None:
        check_unchanged(recorded, data)
    tok = ChatTokenizer(resolve_path(tokenizer_dir))
    key = cache_key({"data": data.digest, "tokenizer": tok.digest, "seq_len": cfg.seq_len, "loss": cfg.loss,
                     "overlong": cfg.overlong, "val_samples": cfg.val_samples})
    entry, hit = open_or_build(cache_dir, key, lambda tmp: build(tmp, files, cfg, tok))
    stats = DataStats(**read_header(entry)["stats"])
    stats.cache_hit = hit
    stats.seconds = time.perf_counter() - start
    return ChatData(tok, entry, stats, data)
