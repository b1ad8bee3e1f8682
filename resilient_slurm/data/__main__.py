"""`python -m resilient_slurm.data tokenize|prepare ...`: the CPU-side steps of pretraining data.

    tokenize --input FILE... --output-prefix PREFIX --tokenizer DIR [--workers N] [--text-key text]
             [--bad-lines error|skip] [--no-eos] [--chunk-lines N] [--no-progress]
    prepare  +experiment=NAME data.sources=[...] [key=value ...]
    prepare  --source name=web,path=/data/tok/web,weight=0.7 [--source ...] [--seq-len N] [--seed N]
             [--global-batch-size N] [--max-steps N | --max-tokens N] [--val-sequences N]
             [--tokenizer DIR] [--vocab-size N] [--index-dir DIR] [--on-exhausted repeat|stop]

tokenize: raw text to Megatron's .bin/.idx with a model directory's tokenizer, EOS after each
document, --workers processes, resumable after a kill. prepare: the global sample order of a run's
mixture, written next to the data, so that the run's start only maps it (the start builds it on
rank 0 when it is absent). `python -m resilient_slurm.data tokenize --help` and `... prepare --help`
describe each.

Exit status: 0 done; 2 bad input or arguments, one line naming the file or key and the fix.
"""

from __future__ import annotations

import argparse
import os
import sys

from resilient_slurm.errors import InputError
from resilient_slurm.exit_codes import ExitCode

def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__, end="")
        return ExitCode.DONE
    if not argv or argv[0] not in ("tokenize", "prepare"):
        print(__doc__, end="", file=sys.stderr)
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
        raise InputError("--workers and --chunk-lines: set them to 1 or more")
    from resilient_slurm.data.tokenizer import resolve_path

    directory = resolve_path(a.tokenizer)
    if not os.path.isfile(os.path.join(directory, "tokenizer.json")):
        what = "no tokenizer.json there" if os.path.isdir(directory) else "no such directory"
        raise InputError(f"--tokenizer {a.tokenizer}: {what}; give a Hugging Face model directory that has "
                         f"tokenizer.json")
    report = tokenize(a.input, a.output_prefix, a.tokenizer, a.workers, a.text_key, a.bad_lines, not a.no_eos,
                      not a.no_progress, a.chunk_lines)
    print(report.line(), flush=True)
    return ExitCode.DONE


_PREPARE = """\
The global sample order of a run's mixture, built ahead of the run (on CPU nodes) and memory-mapped
next to the data, so that the run's start only maps it. It must be the run's own config, in one of
two forms:

  prepare +experiment=NAME data.sources=[...] [key=value ...]   (exactly the run's launch overrides)
  prepare --source name=web,path=/data/tok/web,weight=0.7 --source ... [--seq-len N] [--seed N] ...

Examples:
  python -m resilient_slurm.data prepare +experiment=llama8b_pretrain \\
      'data.sources=[{name:web,path:/data/tok/web,weight:0.7},{name:code,path:/data/tok/code,weight:0.3}]'
  python -m resilient_slurm.data prepare --source name=web,path=/data/tok/web,weight=0.7 \\
      --source name=code,path=/data/tok/code,weight=0.3 --seq-len 8192 --global-batch-size 512 --max-steps 10000

Prints one line per source: its windows, epochs and where the order was written.
"""


def _prepare(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        print(_PREPARE, end="", file=sys.stdout if argv else sys.stderr)
        return ExitCode.DONE if argv else ExitCode.CONFIG
    from resilient_slurm.data.tokens.prepare import compose, config_from_flags, prepare

    if any(a.startswith("--") for a in argv):
        p = argparse.ArgumentParser(prog="python -m resilient_slurm.data prepare", description=_PREPARE,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--source", action="append", required=True, metavar="name=N,path=P,weight=W[,dtype=D]",
                       help="one source of the mixture (repeat for each): its name, its token prefix, file, glob or "
                            "directory, its target share of the trained tokens, the dtype of headerless arrays")
        flags = {"--seq-len": "data.seq_len", "--seed": "train.seed", "--global-batch-size": "data.global_batch_size",
                 "--max-steps": "train.max_steps", "--max-tokens": "train.max_tokens",
                 "--val-sequences": "data.val_sequences", "--vocab-size": "model.vocab_size"}
        for flag, key in flags.items():
            p.add_argument(flag, type=int, metavar="N", help=f"the run's {key} (default: the config's)")
        for flag, key in (("--tokenizer", "data.tokenizer"), ("--index-dir", "data.index_dir"),
                          ("--on-exhausted", "data.on_exhausted")):
            p.add_argument(flag, help=f"the run's {key}")
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
