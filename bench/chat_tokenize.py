"""Tokenizing chat data into the cache (cold), and opening it again (a cache hit).

    python bench/chat_tokenize.py [--conversations 100000] [--long 20000] [--repeats 2] [--tokenizer asset:tiny_chat]

Writes two generated `.jsonl` files and prints one table:
- "tiny tasks": `--conversations` conversations of the shipped tiny chat set's kind (one or two
  short turns, ~30 tokens each), seq_len 128;
- "long chats": `--long` conversations with a system prompt and three user/assistant turns of
  20-80 words each (~600 tokens), seq_len 2048.
For each: the cold build (parse, split, render, tokenize, pack, write; median of --repeats, each
into an empty cache) as conversations/s and tokens/s, and a cache hit (median of 11), with the
part of it spent hashing the data file (sha256; it grows with the file, ~1-2 GB/s).
The build runs in one process; the tokenizer's batch encoding uses its own threads.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file would shadow the standard library's `tokenize` (which linecache, and so
# dataclasses, import): put the repository root in place of bench/ before importing anything else.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from resilient_slurm.config import DataConfig  # noqa: E402
from resilient_slurm.data.chat.cache import data_files, fingerprint  # noqa: E402
from resilient_slurm.data.chat.dataset import open_chat_data, resolve_path  # noqa: E402
from resilient_slurm.data.chat.tiny import WORDS, conversations  # noqa: E402
from resilient_slurm.data.tokenizer import ChatTokenizer  # noqa: E402


def long_chats(count: int, seed: int) -> Iterator[dict]:
    rng = random.Random(seed)
    vocab = WORDS + ["the", "a", "of", "and", "to", "is", "in", "that", "it", "for", "on", "with", "as", "was"]
    text = lambda: " ".join(rng.choice(vocab) for _ in range(rng.randint(20, 80))) + "."
    for _ in range(count):
        messages = [{"role": "system", "content": text()}]
        for _ in range(3):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        yield {"messages": messages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--long", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", default="asset:tiny_chat", help="a Hugging Face model directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    tok = ChatTokenizer(resolve_path(args.tokenizer))
    print(f"tokenizer: {args.tokenizer} ({tok.vocab_size} tokens, {type(tok.tokenizer.model).__name__}); "
          f"{os.cpu_count()} CPUs\n")
    print("| data | conversations | file MB | train tokens | rows | cold build s | conversations/s | tokens/s "
          "| cache hit ms | of which sha256 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, records, seq_len in (("tiny tasks", conversations(args.conversations, seed=7), 128),
                                   ("long chats", long_chats(args.long, seed=7), 2048)):
        path = work / f"{name.replace(' ', '_')}.jsonl"
        count = 0
        with path.open("w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
                count += 1
        cfg = DataConfig(path=str(path), seq_len=seq_len)
        cold = []
        for _ in range(args.repeats):
            shutil.rmtree(work / "cache", ignore_errors=True)
            start = time.perf_counter()
            data = open_chat_data(cfg, args.tokenizer, str(work / "cache"))
            cold.append(time.perf_counter() - start)
            assert not data.stats.cache_hit
        hits, hashing = [], []
        for _ in range(11):
            start = time.perf_counter()
            data = open_chat_data(cfg, args.tokenizer, str(work / "cache"))
            hits.append(time.perf_counter() - start)
            assert data.stats.cache_hit
            start = time.perf_counter()
            fingerprint(data_files(str(path)))
            hashing.append(time.perf_counter() - start)
        s, build_s = data.stats, statistics.median(cold)
        print(f"| {name} | {count} | {path.stat().st_size / 1e6:.1f} | {s.train_tokens} | {s.train_rows} "
              f"| {build_s:.1f} | {count / build_s:.0f} | {s.train_tokens / build_s:.0f} "
              f"| {statistics.median(hits) * 1e3:.1f} | {statistics.median(hashing) * 1e3:.1f} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
