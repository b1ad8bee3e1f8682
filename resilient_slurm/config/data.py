"""`data.*`: what the run trains on and how it is cut into batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems, safe_name

LOSS_MODES = ("assistant", "all", "last")


@dataclass
class SourceConfig:
    """One source of a pretraining mixture (data.kind=tokens)."""

    name: str = ""
    """Its name in metrics, positions and messages: letters, digits, '.', '_', '-'."""
    path: str = ""
    """A Megatron .bin/.idx prefix, a token array file, a glob, or a directory of them."""
    weight: float = 1.0
    """Its target share of the trained tokens. Weights that do not sum to 1 are normalised (0.7 and
    0.7 train half and half), and the run's first log line says so with the shares it trains."""
    dtype: str | None = None
    """Token dtype of headerless arrays (.npy as OLMo/dolma write: uint16 or uint32); Megatron files carry theirs."""


@dataclass
class DataConfig:
    kind: str = "chat"
    """chat: conversations (data.path); tokens: pretraining on token corpora mixed by weight (data.sources)."""
    task: str = "tiny-chat"
    """Dataset name in generated run names for the package's own data (`asset:`); any other data is
    named by the base name of `path`."""
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
    """Conversations held out for evaluation, never trained on: a count, written as a whole number
    (256), a share of the distinct conversations, below 1 (0.1), 0 for none (validation off), or
    null for min(256, 5%); a number with a point from 1 up (2.0) is refused as ambiguous. Null
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
    sources: list[SourceConfig] = field(default_factory=list)
    """data.kind=tokens: the mixture, [{name, path, weight}, ...]."""
    on_exhausted: str = "repeat"
    """A source with no unseen sequence left: repeat (a new epoch of it, in a new order) or stop the run."""
    document_mask: bool = False
    """Keep attention and positions inside each document of a window (else plain causal over the window)."""
    val_sequences: int = 64
    """Windows held out of each source for validation loss and perplexity, never trained on."""
    phase: str = "main"
    """Data phase: resuming with another name and new sources or weights starts a new phase at that step."""
    index_dir: str = ""
    """Where prepared orders are kept; empty = order-index/ beside each source's files."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.kind in ("chat", "tokens"), f"data.kind: {self.kind!r}; use chat or tokens")
        p.need(self.kind == "tokens" or bool(self.path),
               "data.path: empty; set data.path=FILE.jsonl (or a directory of .jsonl files)")
        if self.kind == "tokens":
            p.extend_new(self._token_problems())
        p.need(self.loss in LOSS_MODES, f"data.loss: {self.loss!r} unknown; use one of {', '.join(LOSS_MODES)}")
        p.need(self.overlong in ("truncate", "drop"), f"data.overlong: {self.overlong!r}; use truncate or drop")
        p.need(self.bad_lines in ("error", "skip"), f"data.bad_lines: {self.bad_lines!r}; use error or skip")
        p.need(self.micro_batch_size >= 1, f"data.micro_batch_size: {self.micro_batch_size}; set it to 1 or more")
        v = self.val_samples
        p.need(v is None or v == 0 or 0 < v < 1 or (v >= 1 and float(v).is_integer()),
               f"data.val_samples: {v}; use a count (256), a share in (0, 1) (0.05), 0 for no validation, or null "
               f"for min(256, 5%)")
        return p

    def mixture(self) -> str:
        """The shares each source trains, for the first log line: `prose 70%, math 30%`, and a note when
        the weights did not sum to 1 and were normalised."""
        total = sum(s.weight for s in self.sources)
        shares = ", ".join(f"{s.name} {100 * s.weight / total:.3g}%" for s in self.sources) if total > 0 else ""
        if abs(total - 1) <= 1e-6:
            return shares
        weights = " + ".join(f"{s.weight:g}" for s in self.sources)
        return f"{shares} (weights {weights} = {total:g}, normalised to shares of 1)"

    def _token_problems(self) -> list[str]:
        p = Problems()
        p.need(bool(self.sources), "data.sources: empty; give the mixture, "
               "data.sources=[{name:web,path:/data/tok/web,weight:1}]")
        for i, s in enumerate(self.sources):
            key = f"data.sources[{s.name or i}]"
            p.need(safe_name(s.name), f"data.sources[{i}].name: {s.name!r} is not a plain name; use letters, digits, "
                                      "'.', '_', '-'")
            p.need(s.weight > 0, f"{key}.weight: {s.weight}; set a weight > 0 (or remove the source)")
            p.need(bool(s.path), f"{key}.path: empty; set it to a token prefix, file, glob or directory")
            p.need(s.dtype in (None, "uint16", "uint32", "int32", "int64"),
                   f"{key}.dtype: {s.dtype!r}; use uint16 or uint32 (or leave it unset)")
        names = [s.name for s in self.sources]
        p.need(len(set(names)) == len(names), f"data.sources: names {names} repeat; give each source its own name")
        p.need(self.on_exhausted in ("repeat", "stop"), f"data.on_exhausted: {self.on_exhausted!r}; use repeat or stop")
        p.need(self.val_sequences >= 0, f"data.val_sequences: {self.val_sequences}; set it >= 0")
        p.need(safe_name(self.phase), f"data.phase: {self.phase!r} is not a plain name; use letters, digits, '.', '_', '-'")
        return p
