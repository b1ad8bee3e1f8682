"""`python -m resilient_slurm.data tokenize`: raw text → one Megatron `.bin/.idx` prefix, on many
processes, resumable after a kill.

Each input is cut into chunks of `chunk_items` lines (rows), and each chunk becomes a shard (a small
`.bin/.idx` pair) in `PREFIX.parts/`, its `.json` written last as its marker; workers encode batches
of lines and the parent writes shards in input order. After a kill, a rerun of the same command
skips every finished shard (reading its lines without encoding them) and redoes only the rest, so
the output is byte-identical to an uninterrupted run. When every shard is there they are merged
into `PREFIX.bin/.idx` under temporary names, renamed, and `PREFIX.tokenize.json` (the job and its
counts) is written last: it is the marker of a finished output, which a rerun never rewrites. A
prefix whose files exist without that marker or a parts directory is someone else's, and is refused.

Documents are encoded as the model's tokenizer encodes them with its special tokens (a Llama-3
tokenizer prepends BOS), as Megatron's HuggingFaceTokenizer does, and get the tokenizer's EOS
appended unless `append_eos` is off (Megatron's --append-eod). Tokens are uint16 when the vocabulary
has fewer than 65,500 ids, else int32 (Megatron's rule). Workers encode with one thread each, so N
workers use N cores. A bad line stops the run with `file:line: what is wrong` (bad_lines=error,
exit status 2), or is skipped and counted (skip).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from resilient_slurm.data.tokens.corpus import MegatronFile
from resilient_slurm.data.tokens.idx_format import token_dtype
from resilient_slurm.data.tokens.idx_writer import IdxWriter
from resilient_slurm.data.tokens.progress import progress_bar
from resilient_slurm.data.tokens.records import text_of_line, text_of_value
from resilient_slurm.data.tokens.text_inputs import InputReader, check_input
from resilient_slurm.files import atomic_write
from resilient_slurm.data.tokenizer import ChatTokenizer, resolve_path
from resilient_slurm.errors import InputError

FORMAT = 1
CHUNK_ITEMS = 50_000
"""Lines per shard: what a rerun after a kill redoes at most, per worker."""
BATCH_ITEMS = 256
"""Lines per worker task."""


class TokenizeError(InputError):
    """Bad input or a prefix that is not ours to write; one line (exit status 2)."""


@dataclass
class Counts:
    lines: int = 0
    documents: int = 0
    tokens: int = 0
    skipped: int = 0
    """Bad lines skipped (bad_lines=skip)."""
    blank: int = 0
    """Blank lines and empty texts: no document."""
    first_problem: str = ""

    def add(self, other: Counts) -> None:
        for key in ("lines", "documents", "tokens", "skipped", "blank"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        self.first_problem = self.first_problem or other.first_problem


@dataclass
class TokenizeReport:
    prefix: str
    dtype: str
    counts: Counts = field(default_factory=Counts)
    seconds: float = 0.0
    shards_reused: int = 0
    already_finished: bool = False

    def line(self) -> str:
        c = self.counts
        if self.already_finished:
            return f"tokenize: {self.prefix} is already finished ({c.documents} documents, {c.tokens} tokens); not rewritten"
        rate = max(self.seconds, 1e-9)
        out = (f"tokenize: {self.prefix}.bin/.idx: {c.documents} documents, {c.tokens} tokens ({self.dtype}) in "
               f"{self.seconds:.1f} s: {c.documents / rate:,.0f} documents/s, {c.tokens / rate:,.0f} tokens/s")
        if self.shards_reused:
            out += f"; {self.shards_reused} finished chunks reused"
        if c.skipped:
            out += f"; skipped {c.skipped} bad lines (first: {c.first_problem})"
        return out


_TOKENIZER: ChatTokenizer | None = None


def _init_worker(tokenizer_dir: str) -> None:
    global _TOKENIZER
    # One core per worker: the Rust tokenizer would otherwise start a thread per core in every worker.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _TOKENIZER = ChatTokenizer(tokenizer_dir, need_template=False)


def encode_items(items: list[tuple[int, Any]], where: str, key: str, eos: int | None,
                 dtype: str) -> tuple[np.ndarray, np.ndarray, Counts, list[str]]:
    """Tokens and lengths of the documents among `items`, their counts, and the bad lines' messages."""
    assert _TOKENIZER is not None
    counts = Counts(lines=len(items))
    texts, problems = [], []
    for number, item in items:
        text, problem = text_of_line(item, key) if isinstance(item, bytes) else text_of_value(item, key)
        if problem is not None:
            problems.append(f"{where}:{number}: {problem}")
        elif text:
            texts.append(text)
        else:
            counts.blank += 1
    extra = [eos] if eos is not None else []
    encoded = [e.ids + extra for e in _TOKENIZER.tokenizer.encode_batch(texts)] if texts else []
    lengths = np.array([len(ids) for ids in encoded], np.int32)
    tokens = np.fromiter(itertools.chain.from_iterable(encoded), dtype, int(lengths.sum()))
    counts.documents, counts.tokens = len(encoded), int(lengths.sum())
    return tokens, lengths, counts, problems


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def tokenize(inputs: list[str], prefix: str, tokenizer_dir: str, workers: int = 1, text_key: str = "text",
             bad_lines: str = "error", append_eos: bool = True, progress: bool = True,
             chunk_items: int = CHUNK_ITEMS) -> TokenizeReport:
    start = time.perf_counter()
    for path in inputs:
        check_input(path)
    tokenizer_dir = resolve_path(tokenizer_dir)
    tok = ChatTokenizer(tokenizer_dir, need_template=False)
    dtype = token_dtype(tok.vocab_size)
    eos = tok.eos_ids[0] if append_eos else None
    job: dict[str, Any] = {"format": FORMAT, "tokenizer": tok.digest, "text_key": text_key, "eos": eos, "dtype": dtype,
           "bad_lines": bad_lines, "chunk_items": chunk_items,
           "inputs": [{"path": os.path.abspath(p), "bytes": os.path.getsize(p), "mtime_ns": os.stat(p).st_mtime_ns}
                      for p in inputs]}
    report = TokenizeReport(prefix, dtype)
    marker, parts = prefix + ".tokenize.json", prefix + ".parts"
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            done = json.load(f)
        if done["job"] != job:
            raise TokenizeError(f"{prefix}: already a finished tokenize output of other inputs or settings; choose "
                                f"another --output-prefix, or delete {prefix}.bin, .idx and .tokenize.json")
        report.counts, report.already_finished = Counts(**done["counts"]), True
        return report
    if (os.path.exists(prefix + ".bin") or os.path.exists(prefix + ".idx")) and not os.path.isdir(parts):
        raise TokenizeError(f"{prefix}.bin/.idx exist and are not an unfinished tokenize output; choose another "
                            "--output-prefix, or delete them")
    _open_parts(parts, job)
    pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, (tokenizer_dir,)) if workers > 1 else None
    if pool is None:
        _init_worker(tokenizer_dir)
    bar = progress_bar(sum(i["bytes"] for i in job["inputs"]), "tokenize", progress, unit="B", unit_scale=True)
    try:
        shards = _encode_all(inputs, parts, job, workers, pool, bar, report, start)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()
    _merge(shards, prefix, dtype)
    _write_json(marker, {"job": job, "counts": asdict(report.counts)})
    shutil.rmtree(parts, ignore_errors=True)
    report.seconds = time.perf_counter() - start
    return report


def _open_parts(parts: str, job: dict[str, Any]) -> None:
    """The parts directory of this job; one left by another job (inputs changed since) is cleared."""
    path = os.path.join(parts, "job.json")
    try:
        with open(path, encoding="utf-8") as f:
            same = json.load(f) == job
    except (OSError, ValueError):
        same = False
    if not same:
        shutil.rmtree(parts, ignore_errors=True)
        os.makedirs(parts)
        _write_json(path, job)


def _encode_all(inputs: list[str], parts: str, job: dict[str, Any], workers: int, pool: Any, bar: Any,
                report: TokenizeReport, start: float) -> list[str]:
    """Every shard of every input, encoded or reused; their names in order."""
    shards: list[str] = []
    inflight: deque[tuple[str, bool, Any]] = deque()
    buffers: dict[str, tuple[list[np.ndarray], list[np.ndarray], Counts]] = {}
    key, eos, dtype, chunk = job["text_key"], job["eos"], job["dtype"], job["chunk_items"]
    done_bytes = 0

    def finish_one() -> None:
        shard, last, pending = inflight.popleft()
        tokens, lengths, counts, problems = pending.get()
        if problems and job["bad_lines"] == "error":
            raise TokenizeError(problems[0])
        counts.skipped = len(problems)
        counts.first_problem = problems[0] if problems else ""
        parts_of = buffers.setdefault(shard, ([], [], Counts()))
        parts_of[0].append(tokens)
        parts_of[1].append(lengths)
        parts_of[2].add(counts)
        if last:
            _write_shard(shard, *buffers.pop(shard), dtype)
            report.counts.add(parts_of[2])
        c, elapsed = report.counts, max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{c.documents / elapsed:,.0f} docs/s, {c.tokens / elapsed:,.0f} tok/s", refresh=False)

    for index, path in enumerate(inputs):
        reader = InputReader(path, key)
        for number, items in enumerate(_chunks(reader.items(), chunk)):
            shard = os.path.join(parts, f"{index:05d}-{number:06d}")
            shards.append(shard)
            if os.path.exists(shard + ".json"):
                with open(shard + ".json", encoding="utf-8") as f:
                    report.counts.add(Counts(**json.load(f)))
                report.shards_reused += 1
            else:
                batches = [items[i:i + BATCH_ITEMS] for i in range(0, len(items), BATCH_ITEMS)]
                for b, batch in enumerate(batches):
                    args = (batch, path, key, eos, dtype)
                    pending = pool.apply_async(encode_items, args) if pool is not None else _Done(encode_items(*args))
                    inflight.append((shard, b == len(batches) - 1, pending))
                    while len(inflight) > 2 * workers:
                        finish_one()
            position = done_bytes + reader.bytes_read()
            bar.update(max(position - bar.n, 0))
        done_bytes += reader.size
    while inflight:
        finish_one()
    bar.update(max(done_bytes - bar.n, 0))
    return shards


def _chunks(items: Iterator[tuple[int, Any]], size: int) -> Iterator[list[tuple[int, Any]]]:
    chunk: list[tuple[int, Any]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write_shard(shard: str, tokens: list[np.ndarray], lengths: list[np.ndarray], counts: Counts, dtype: str) -> None:
    writer = IdxWriter(shard + ".bin.tmp", shard + ".idx.tmp", dtype)
    writer.add(np.concatenate(tokens) if tokens else np.empty(0, dtype), np.concatenate(lengths))
    writer.finish()
    os.replace(shard + ".bin.tmp", shard + ".bin")
    os.replace(shard + ".idx.tmp", shard + ".idx")
    _write_json(shard + ".json", asdict(counts))


def _merge(shards: list[str], prefix: str, dtype: str) -> None:
    tmp = f"{prefix}.tmp-{os.getpid()}"
    writer = IdxWriter(tmp + ".bin", tmp + ".idx", dtype)
    try:
        for shard in shards:
            part = MegatronFile(shard)
            lengths = np.fromfile(part.idx, np.int32, part.header.sequences, offset=part.header.lengths_offset)
            writer.add_file(part.path, lengths)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")


def _write_json(path: str, value: Any) -> None:
    atomic_write(Path(path), json.dumps(value, indent=1, sort_keys=True))

