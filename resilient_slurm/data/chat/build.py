"""Building one cache entry: chat `.jsonl` files → tokenized, split, packed rows on disk.

Two passes over the files. The first parses every line and hashes each conversation
(`conversation_key`); the held-out split is then the conversations with the smallest distinct
hashes, as many as `split.held_out` makes of `val_samples` (possibly none), a set that depends on the conversations alone (not on their order, the world size
or a seed). Copies of a conversation all land on the same side, so data with many duplicates holds
out more than `val_samples` lines. The second pass renders and tokenizes
(in chunks, so the tokenizer's own threads work on many texts at once), applies `overlong`, and
keeps each document's ids and loss mask; both splits are then packed (`packing.pack`) and written.

A malformed line is a `BadLine`: an error naming `file:line` and what is wrong, or with
`bad_lines=skip` a count in the stats. Blank lines are ignored.

Entry files: `{train,val}_{tokens,docs,loss}.npy` (rows × seq_len: int32 ids, int32 document index
in the row or -1 for padding, uint8 target flags) and `eval_{prompt,target}.npy` with
`eval_{prompt,target}_offsets.npy` (the exact-match samples, flat ids and boundaries).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from resilient_slurm.checkpoint.store import fsync_path
from resilient_slurm.config import DataConfig
from resilient_slurm.data.chat import cache as chat_cache
from resilient_slurm.data.chat.encode import EncodedChat, encode_chat, render_chat
from resilient_slurm.data.chat.format import BadLine, Message, conversation_key, parse_line
from resilient_slurm.data.chat.split import held_out
from resilient_slurm.data.chat_template import TemplateRenderError
from resilient_slurm.data.packing import fit_length, pack
from resilient_slurm.data.tokenizer import ChatTokenizer
from resilient_slurm.errors import InputError

CHUNK = 512
"""Conversations tokenized per batch call."""
SPLITS = ("train", "val")
Parsed = tuple[str, list[Message], int, list[dict[str, Any]] | None]
"""A well-formed line: its `file:line`, its messages, its conversation key and its tools."""


class DataFormatError(InputError):
    """Data the run cannot train on: a malformed line (`file:line: what is wrong; the fix`), or a set
    with nothing left to train on."""


@dataclass
class DataStats:
    """What tokenizing the data found; the ledger records it."""

    files: int = 0
    lines: int = 0
    """Non-blank lines read."""
    skipped_lines: int = 0
    """Malformed lines skipped (data.bad_lines=skip)."""
    skipped_examples: list[str] = field(default_factory=list)
    """The first few skipped lines' `file:line: reason`."""
    conversations: int = 0
    val_conversations: int = 0
    """Held out (data.val_samples), never trained on; the rest train."""
    truncated: int = 0
    """Conversations longer than data.seq_len cut to it (data.overlong=truncate)."""
    dropped: int = 0
    """Conversations left out: longer than data.seq_len with data.overlong=drop, or truncated so far
    that no loss token was left."""
    train_rows: int = 0
    val_rows: int = 0
    train_tokens: int = 0
    """Tokens in training rows (padding excluded)."""
    train_loss_tokens: int = 0
    val_tokens: int = 0
    """Tokens in held-out rows (padding excluded)."""
    eval_samples: int = 0
    """Held-out conversations whose prompt and last reply fit data.seq_len (exact-match samples)."""
    cache_hit: bool = False
    seconds: float = 0.0
    """Time to open the data: mapping the cache on a hit, tokenizing and packing on a miss."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def build(entry: str, files: list[str], cfg: DataConfig, tok: ChatTokenizer) -> None:
    """Write a complete entry, its stats in the header, into the new directory `entry` (header last)."""
    stats = DataStats(files=len(files))
    keys = [key for _, _, key, _ in _parsed(files, cfg, stats, count=True)]
    if not keys:
        raise DataFormatError(f"data.path: no well-formed conversation in {', '.join(files)[:200]} "
                         f"({stats.skipped_lines} malformed lines skipped); check the files' format")
    distinct = np.unique(np.array(keys, dtype=np.uint64))
    n_val = held_out(len(distinct), cfg.val_samples)
    if n_val >= len(distinct):
        raise DataFormatError(f"data.val_samples: {cfg.val_samples:g} holds out {n_val} conversations and leaves none to "
                              f"train on ({len(distinct)} distinct in {', '.join(files)[:200]}); lower it, or leave it "
                              f"unset for min(256, 5%)")
    threshold = int(distinct[n_val - 1]) if n_val else -1
    docs: dict[str, list[EncodedChat]] = {"train": [], "val": []}
    evals: list[EncodedChat] = []
    for chunk in _chunks(_parsed(files, cfg, stats, count=False)):
        for key, encoded in _encode(chunk, cfg, tok, stats):
            split = "val" if key <= threshold else "train"  # no key is <= -1: nothing held out
            stats.conversations += 1
            stats.val_conversations += split == "val"
            kept = _fit(encoded, cfg, stats)
            if kept is not None:
                docs[split].append(kept)
            if split == "val" and encoded.prompt_len + encoded.target_len <= cfg.seq_len:
                evals.append(encoded)
    if not docs["train"]:
        raise DataFormatError(f"data.path: no conversation of {', '.join(files)[:200]} fits data.seq_len={cfg.seq_len}; "
                         "raise data.seq_len or use data.overlong=truncate")
    os.makedirs(entry)
    stats.train_rows = _write_rows(entry, "train", docs["train"], cfg.seq_len, tok.pad_id)
    stats.val_rows = _write_rows(entry, "val", docs["val"], cfg.seq_len, tok.pad_id)
    stats.train_tokens = sum(len(d.ids) for d in docs["train"])
    stats.train_loss_tokens = sum(int(d.loss.sum()) for d in docs["train"])
    stats.val_tokens = sum(len(d.ids) for d in docs["val"])
    stats.eval_samples = len(evals)
    _write_flat(entry, "eval_prompt", [d.ids[: d.prompt_len] for d in evals])
    _write_flat(entry, "eval_target", [d.ids[d.prompt_len : d.prompt_len + d.target_len] for d in evals])
    chat_cache.write_header(entry, {"stats": stats.to_dict(), "seq_len": cfg.seq_len})


def _parsed(files: list[str], cfg: DataConfig, stats: DataStats, count: bool) -> Iterator[Parsed]:
    """(file:line, messages, conversation key) of every well-formed line; `count` records the lines
    and skips (the first pass), so the second pass does not count them again."""
    for path in files:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                where = f"{path}:{number}"
                stats.lines += count
                try:
                    conversation = parse_line(raw.decode("utf-8-sig"))
                except UnicodeDecodeError:
                    _bad(where, "not UTF-8 text", cfg, stats, count)
                    continue
                except BadLine as e:
                    _bad(where, str(e), cfg, stats, count)
                    continue
                messages, tools = conversation.messages, conversation.tools
                yield where, messages, conversation_key(messages, tools), tools


def _bad(where: str, reason: str, cfg: DataConfig, stats: DataStats, count: bool = True) -> None:
    if cfg.bad_lines != "skip":
        raise DataFormatError(f"{where}: {reason}; fix the line, or set data.bad_lines=skip to skip such lines")
    if count:
        stats.skipped_lines += 1
        if len(stats.skipped_examples) < 5:
            stats.skipped_examples.append(f"{where}: {reason}")


def _chunks(items: Iterator[Parsed]) -> Iterator[list[Parsed]]:
    chunk: list[Parsed] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _encode(chunk: list[Parsed], cfg: DataConfig, tok: ChatTokenizer,
            stats: DataStats) -> Iterator[tuple[int, EncodedChat]]:
    """(conversation key, encoding) of each conversation of the chunk that the template accepts."""
    rendered = []
    for where, messages, key, tools in chunk:
        try:
            rendered.append((where, key, render_chat(tok.template, messages, tools)))
        except TemplateRenderError as e:
            _bad(where, str(e), cfg, stats)
    encodings = tok.encode_batch([r.text for _, _, r in rendered])
    for (where, key, r), enc in zip(rendered, encodings):
        try:
            yield key, encode_chat(r, enc.ids, enc.offsets, cfg.loss, tok.eos_ids)
        except TemplateRenderError as e:
            _bad(where, str(e), cfg, stats)


def _fit(doc: EncodedChat, cfg: DataConfig, stats: DataStats) -> EncodedChat | None:
    n = fit_length(len(doc.ids), cfg.seq_len, cfg.overlong)
    if n == len(doc.ids):
        return doc
    if n == 0 or not doc.loss[:n].any():
        stats.dropped += 1
        return None
    stats.truncated += 1
    return EncodedChat(doc.ids[:n], doc.loss[:n], doc.prompt_len, doc.target_len)


def _write_rows(entry: str, split: str, docs: list[EncodedChat], seq_len: int, pad_id: int) -> int:
    rows = pack([len(d.ids) for d in docs], seq_len)
    shape = (len(rows), seq_len)
    tokens = _array(entry, f"{split}_tokens", np.int32, shape, pad_id)
    doc_index = _array(entry, f"{split}_docs", np.int32, shape, -1)
    loss = _array(entry, f"{split}_loss", np.uint8, shape, 0)
    for r, members in enumerate(rows):
        at = 0
        for i, d in enumerate(members):
            n = len(docs[d].ids)
            tokens[r, at : at + n] = docs[d].ids
            doc_index[r, at : at + n] = i
            loss[r, at : at + n] = docs[d].loss
            at += n
    for array, name in ((tokens, "tokens"), (doc_index, "docs"), (loss, "loss")):
        array.flush()
        fsync_path(os.path.join(entry, f"{split}_{name}.npy"))
    return len(rows)


def _write_flat(entry: str, name: str, pieces: list[np.ndarray]) -> None:
    offsets = np.cumsum([0] + [len(p) for p in pieces], dtype=np.int64)
    flat = np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, dtype=np.int32)
    for suffix, array in (("", flat), ("_offsets", offsets)):
        path = os.path.join(entry, f"{name}{suffix}.npy")
        np.save(path, array)
        fsync_path(path)


def _array(entry: str, name: str, dtype: type, shape: tuple[int, int], fill: int) -> np.memmap:
    array = np.lib.format.open_memmap(os.path.join(entry, f"{name}.npy"), mode="w+", dtype=dtype, shape=shape)
    array[:] = fill
    return array
