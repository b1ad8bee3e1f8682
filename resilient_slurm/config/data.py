"""`data.*`: what the run trains on and how it is cut into batches."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.config.checks import Problems

LOSS_MODES = ("assistant", "all", "last")


@dataclass
class DataConfig:
    task: str = "tiny-chat"
    """Dataset name, used in generated run names."""
    path: str = "asset:tiny_chat/chat.jsonl"
    """A chat .jsonl file or a directory of them: `messages` (system/user/assistant, multi-turn) or
    `prompt`/`completion` lines. `asset:tiny_chat/chat.jsonl` is the small set the package ships."""
    tokenizer: str = "asset:tiny_chat"
    """Hugging Face directory with tokenizer.json and the chat template; empty = model.pretrained.
    `asset:tiny_chat` is the small one the package ships."""
    seq_len: int = 128
    """Tokens per row: conversations are packed into rows of this length, each attending only to itself."""
    global_batch_size: int = 8
    """Rows per optimizer step over all ranks; kept constant when the world size changes."""
    micro_batch_size: int = 4
    """Rows per forward/backward on one rank; accumulation = global / (micro * ranks). Where it does
    not fit in device memory, the run lowers it (ledger: oom_retry) and keeps the lower value on later
    starts with this same setting; how the rows are cut does not change what a step computes."""
    val_samples: float | None = None
    """Conversations held out for evaluation, never trained on: a count (256), a share of the
    distinct conversations (0.1), 0 for none (validation off), or null for min(256, 5%), which
    never leaves fewer than 90% to train on (data/chat/split.py). Those with the smallest content
    hashes are taken (a fixed set whatever the file order or world size), every copy of each."""
    loss: str = "assistant"
    """Tokens trained on: assistant (every assistant turn), last (the last one only), or all."""
    overlong: str = "truncate"
    """A conversation longer than seq_len is truncated to it, or dropped; both are counted."""
    bad_lines: str = "error"
    """A malformed line stops the run with its file:line (error), or is skipped and counted (skip)."""
    cache_dir: str = ""
    """Where tokenized data is cached (keyed by data, tokenizer and settings); empty =
    <run.root>/.cache/tokenized."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(bool(self.path), "data.path: empty; set data.path=FILE.jsonl (or a directory of .jsonl files)")
        p.need(self.loss in LOSS_MODES, f"data.loss: {self.loss!r} unknown; use one of {', '.join(LOSS_MODES)}")
        p.need(self.overlong in ("truncate", "drop"), f"data.overlong: {self.overlong!r}; use truncate or drop")
        p.need(self.bad_lines in ("error", "skip"), f"data.bad_lines: {self.bad_lines!r}; use error or skip")
        p.need(self.micro_batch_size >= 1, f"data.micro_batch_size: {self.micro_batch_size}; set it to 1 or more")
        v = self.val_samples
        p.need(v is None or v == 0 or 0 < v < 1 or (v >= 1 and float(v).is_integer()),
               f"data.val_samples: {v}; use a count (256), a share in (0, 1) (0.05), 0 for no validation, or null "
               f"for min(256, 5%)")
        return p
