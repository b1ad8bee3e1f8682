"""`python -m resilient_slurm.data tokenize|prepare ...`: the CPU-side steps of pretraining data.

    tokenize --input FILE... --output-prefix PREFIX --tokenizer DIR [--workers N] [--text-key text]
             [--bad-lines error|skip] [--no-eos] [--chunk-lines N] [--no-progress]
    prepare  +experiment=NAME data.sources=[...] [key=value ...]
    prepare  --source name=web,path=/data/tok/web,weight=0.7 [--source ...] [--seq-len N] [--seed N]
             [--global-batch-size N] [--max-steps N | --max-tokens N] [--val-sequences N]
             [--tokenizer DIR] [--vocab-size N] [--index-dir DIR] [--on-exhausted repeat|stop]

Exit status: 0 done; 2 bad input or arguments, one line naming the file or key and the fix.
"""

from __future__ import annotations

import argparse
import sys

from resilient_slurm.errors import InputError
from resilient_slurm.exit_codes import ExitCode

def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("tokenize", "prepare"):
        print(__doc__, file=sys.stderr)
        return ExitCode.CONFIG
    try:
        return _tokenize(argv[1:]) if argv[0] == "tokenize" else _prepare(argv[1:])
    except InputError as e:  # TokenizeError, TokenDataError, ConfigError, TokenizerError, TextInputError, ...
        for line in str(e).splitlines():
            print(f"resilient_slurm: {argv[0]}: {line}", file=sys.stderr)
        return ExitCode.CONFIG


def _tokenize(argv: list[str]) -> int:
    from resilient_slurm.data.tokens.tokenize_files import CHUNK_ITEMS, tokenize

    p = argparse.ArgumentParser(prog="python -m resilient_slurm.data tokenize",
                                description="raw text (.jsonl, .jsonl.gz, .jsonl.zst, parquet) to a Megatron .bin/.idx")
    p.add_argument("--input", nargs="+", required=True, help="input files, in this order")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face model directory with tokenizer.json")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--text-key", default="text")
    p.add_argument("--bad-lines", choices=("error", "skip"), default="error")
    p.add_argument("--no-eos", action="store_true", help="do not append the tokenizer's EOS to each document")
    p.add_argument("--chunk-lines", type=int, default=CHUNK_ITEMS, help="lines per resumable chunk")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.workers < 1 or a.chunk_lines < 1:
        raise ValueError("--workers and --chunk-lines: set them to 1 or more")
    report = tokenize(a.input, a.output_prefix, a.tokenizer, a.workers, a.text_key, a.bad_lines, not a.no_eos,
                      not a.no_progress, a.chunk_lines)
    print(report.line(), flush=True)
    return ExitCode.DONE


def _prepare(argv: list[str]) -> int:
    from resilient_slurm.data.tokens.prepare import compose, config_from_flags, prepare

    if any(a.startswith("--") for a in argv):
        p = argparse.ArgumentParser(prog="python -m resilient_slurm.data prepare")
        p.add_argument("--source", action="append", required=True, help="name=web,path=PREFIX,weight=0.7[,dtype=uint16]")
        flags = {"--seq-len": "data.seq_len", "--seed": "train.seed", "--global-batch-size": "data.global_batch_size",
                 "--max-steps": "train.max_steps", "--max-tokens": "train.max_tokens",
                 "--val-sequences": "data.val_sequences", "--vocab-size": "model.vocab_size"}
        for flag in flags:
            p.add_argument(flag, type=int)
        for flag, key in (("--tokenizer", "data.tokenizer"), ("--index-dir", "data.index_dir"),
                          ("--on-exhausted", "data.on_exhausted")):
            p.add_argument(flag)
            flags[flag] = key
        a = vars(p.parse_args(argv))
        cfg = config_from_flags(a.pop("source"), {key: a[flag[2:].replace("-", "_")] for flag, key in flags.items()})
    else:
        cfg = compose(argv)
    rows = prepare(cfg)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return ExitCode.DONE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
