"""The pretraining data path: tokenize throughput, and the time from process start to first batch.

    python bench/pretrain_data.py [--docs 20000] [--vocab 32000] [--sizes 10M,1B] [--repeats 3]
                                  [--tokenizer DIR] [--metrics RUN/metrics.jsonl]

1. tokenize: documents/s and tokens/s at 1 and 2 workers (alternated, median of --repeats), on
   `--docs` documents cut from the Python standard library's own files (real English docstrings
   and code, ~2,000 characters each), with a byte-level BPE of --vocab tokens trained on that text
   by the `tokenizers` library (or --tokenizer, a model directory). Megatron's preprocess_data.py is
   documented at ~6-7k documents/s (80M lines in 214 min, Qwen3-8B tokenizer; its workers and
   documents are not stated), so documents/s are only comparable at similar document lengths:
   the table gives characters and tokens per document beside them.
2. time to first batch, from a fresh process (interpreter start and imports included; torch is
   one of them) to rank 0 of 8 holding its micro-batches, on Megatron corpora of each --sizes
   (10M: random tokens; 1B: a sparse .bin of zeros with a real .idx of 1M documents), seq_len
   2048, global batch 64: with the order prepared (`prepare` ran) or not (the start builds it),
   at the start (position 0) and at a resume (a saved position 90% into a run of --run-steps). Median of
   --repeats, the cases alternated.
3. data time per step as a share of step time needs the trainer: given `--metrics` (a
   tiny_pretrain run's metrics.jsonl on 2 ranks), it prints the median data_wait_s / step_seconds;
   without it, the data side alone (TokenBatchSampler.next_batch) per step of tiny_pretrain at 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from resilient_slurm.data.tokens.idx_format import encode_header  # noqa: E402
from tests.token_corpora import write_jsonl  # noqa: E402

SEQ_LEN, GLOBAL_BATCH, WORLD = 2048, 64, 8


def stdlib_documents(count: int, chars: int = 2000) -> list[str]:
    """Real text: the standard library's .py files, cut into documents of about `chars` characters."""
    out: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for i in range(0, len(text) - chars // 2, chars):
            out.append(text[i:i + chars])
            if len(out) == count:
                return out
    return out


def train_tokenizer(texts: list[str], vocab: int, out: Path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return str(out)


def bench_tokenize(work: Path, docs: int, vocab: int, tokenizer: str | None, repeats: int) -> list[str]:
    from resilient_slurm.data.tokens.tokenize_files import tokenize

    texts = stdlib_documents(docs)
    source = write_jsonl(work / "stdlib.jsonl", texts)
    tokenizer = tokenizer or train_tokenizer(texts[:5000], vocab, work / "tokenizer")
    times: dict[int, list[float]] = {1: [], 2: []}
    report = None
    for r in range(repeats):
        for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
            prefix = work / f"tok-{workers}-{r}"
            report = tokenize([source], str(prefix), tokenizer, workers=workers, progress=False)
            times[workers].append(report.seconds)
            for suffix in (".bin", ".idx", ".tokenize.json"):
                os.remove(f"{prefix}{suffix}")
    assert report is not None
    c = report.counts
    rows = ["| workers | documents | chars/doc | tokens/doc | seconds | documents/s | tokens/s | documents/s per worker |",
            "|---|---|---|---|---|---|---|---|"]
    chars = sum(map(len, texts)) / len(texts)
    for workers, ts in times.items():
        s = statistics.median(ts)
        rows.append(f"| {workers} | {c.documents} | {chars:.0f} | {c.tokens / c.documents:.0f} | {s:.2f} "
                    f"| {c.documents / s:,.0f} | {c.tokens / s:,.0f} | {c.documents / s / workers:,.0f} |")
    return rows


def write_corpus(prefix: Path, tokens: int, sparse: bool) -> None:
    """A Megatron pair of `tokens` uint16 tokens in documents of 1,000 (sparse: a .bin of zeros
    that takes no disk blocks; the .idx is real either way)."""
    docs = tokens // 1000
    with open(f"{prefix}.bin", "wb") as f:
        if sparse:
            f.truncate(docs * 1000 * 2)
        else:
            rng = np.random.default_rng(0)
            for lo in range(0, docs, 1000):
                rng.integers(0, 32000, (min(1000, docs - lo)) * 1000, dtype=np.uint16).tofile(f)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(encode_header("uint16", docs, docs + 1))
        np.full(docs, 1000, np.int32).tofile(f)
        (np.arange(docs, dtype=np.int64) * 2000).tofile(f)
        np.arange(docs + 1, dtype=np.int64).tofile(f)


FIRST_BATCH = """
import json, sys, time
from resilient_slurm.config import Config, DataConfig, SourceConfig
from resilient_slurm.data.tokens.token_data import open_token_data
cfg = Config()
cfg.model.vocab_size = 32000
cfg.data = DataConfig(kind="tokens", tokenizer="", seq_len={seq}, global_batch_size={gb}, micro_batch_size=1,
                      sources=[SourceConfig("web", {prefix!r}, 1.0)])
cfg.train.max_steps = {steps}
opened = time.time()
data = open_token_data(cfg)
sampler = data.sampler(0, {world})
position = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
sampler.restore(position)
batch = sampler.next_batch()
print(json.dumps({{"done": time.time(), "opened": opened, "built": data.stats.index_built}}))
"""


def first_batch(prefix: Path, position: dict | None, steps: int) -> tuple[float, float, bool]:
    """Seconds from process start to the first batch, of which in the data code, and whether it built."""
    script = FIRST_BATCH.format(seq=SEQ_LEN, gb=GLOBAL_BATCH, prefix=str(prefix), world=WORLD, steps=steps)
    args = [sys.executable, "-c", script] + ([json.dumps(position)] if position else [])
    start = time.time()
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise RuntimeError(done.stderr)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["done"] - start, out["done"] - out["opened"], bool(out["built"])


def saved_position(prefix: Path, steps: int) -> dict:
    """A position deep into a run of `steps`: 90% of them done, as train_state.json would hold it."""
    from resilient_slurm.config import Config, DataConfig, SourceConfig
    from resilient_slurm.data.tokens.token_data import open_token_data

    cfg = Config()
    cfg.model.vocab_size = 32000
    cfg.data = DataConfig(kind="tokens", tokenizer="", seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH,
                          micro_batch_size=1, sources=[SourceConfig("web", str(prefix), 1.0)])
    cfg.train.max_steps = steps
    sampler = open_token_data(cfg).sampler(0, WORLD)
    sampler.state.samples_consumed = steps * 9 // 10 * GLOBAL_BATCH
    return sampler.position()


def bench_first_batch(work: Path, sizes: list[str], repeats: int, steps: int) -> list[str]:
    rows = ["| corpus | order index | at | from process start s | of which data s | built the index |",
            "|---|---|---|---|---|---|"]
    for size in sizes:
        tokens = int(float(size[:-1]) * {"M": 1e6, "B": 1e9}[size[-1]])
        prefix = work / f"corpus-{size}"
        write_corpus(prefix, tokens, sparse=tokens > 100_000_000)
        position = saved_position(prefix, steps)
        index = work / "order-index"
        results: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}
        cases = [(prepared, at) for prepared in ("prepared", "absent") for at in ("start", "resume")]
        for r in range(repeats):
            for prepared, at in (cases if r % 2 == 0 else cases[::-1]):
                if prepared == "absent":
                    shutil.rmtree(index, ignore_errors=True)
                else:
                    saved_position(prefix, steps)  # builds it when a previous case removed it
                results.setdefault((prepared, at), []).append(
                    first_batch(prefix, position if at == "resume" else None, steps))
        for (prepared, at), runs in results.items():
            rows.append(f"| {size} tokens | {prepared} | {at} | {statistics.median(r[0] for r in runs):.2f} "
                        f"| {statistics.median(r[1] for r in runs):.3f} | {all(r[2] for r in runs)} |")
        for suffix in (".bin", ".idx"):
            os.remove(f"{prefix}{suffix}")
        shutil.rmtree(index, ignore_errors=True)
    return rows


def bench_step_share(work: Path, metrics: str | None, steps: int) -> list[str]:
    if metrics:
        rows = [json.loads(line) for line in open(metrics, encoding="utf-8")]
        share = statistics.median(r["data_wait_s"] / r["step_seconds"] for r in rows if r.get("step_seconds"))
        return [f"data wait / step time, median over {len(rows)} steps of {metrics}: {share:.2%}"]
    from resilient_slurm.data.tokens.prepare import compose
    from resilient_slurm.data.tokens.token_data import open_token_data

    cfg = compose(["data=tiny_pretrain", f"data.cache_dir={work / 'cache'}", "cluster.ranks=2"])
    samplers = [open_token_data(cfg).sampler(r, 2) for r in range(2)]
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        samplers[0].next_batch()
        seconds.append(time.perf_counter() - start)
        samplers[1].next_batch()
    return [f"tiny_pretrain, 2 ranks: rank 0's next_batch() median {statistics.median(seconds) * 1e3:.2f} ms per step "
            f"over {steps} steps (the share of step time needs a trainer run: pass --metrics RUN/metrics.jsonl)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokenizer", default=None, help="a model directory instead of the trained BPE")
    parser.add_argument("--sizes", default="10M,1B")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="steps timed for the data time per step")
    parser.add_argument("--run-steps", type=int, default=1000, help="the run's budget: what the order covers")
    parser.add_argument("--metrics", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pretrain-"))
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{os.cpu_count()} CPUs, load average {load} (other work on the machine slows every figure)\n\n"
              f"tokenize ({args.docs} documents of the standard library's files):")
        print("\n".join(bench_tokenize(work, args.docs, args.vocab, args.tokenizer, args.repeats)))
        print(f"\ntime to first batch (seq_len {SEQ_LEN}, global batch {GLOBAL_BATCH}, rank 0 of {WORLD}, a run of "
              f"{args.run_steps} steps; resume at 90% of it):")
        print("\n".join(bench_first_batch(work, [s for s in args.sizes.split(",") if s], args.repeats,
                                           args.run_steps)))
        print("\ndata loading per step:")
        print("\n".join(bench_step_share(work, args.metrics, args.steps)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
