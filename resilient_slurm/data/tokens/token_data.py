"""Token data for a run (`data.kind=tokens`): open the sources, check them against what the run
started on, map (or build) each source's order, and hand out samplers and validation rows.

    data = open_token_data(cfg, run_dir, comm.rank)    # every rank, before the model is built
    sampler = data.sampler(comm.rank, comm.world_size)  # TokenBatchSampler: PackedBatchSampler's interface
    sampler.restore(saved["mixture"])                   # after the checkpoint is loaded (None: fresh)
    {..., "mixture": sampler.position()}                # the pipeline's data_state, at every save
    data.val["web"].batch(rows)                         # held-out windows of one source

Everything that can be wrong with the files is found here, before any training: a missing, truncated
or foreign file, an unknown dtype, a token id the model cannot embed, a source whose files changed
since the run's current data phase began (the record `data.json` in the run directory, which names
the file). Opening costs a few reads per file and the maps of the order files; a missing order is
built here, once, by whichever rank comes first (order.py), and its time is in `stats`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_slurm.config import Config, train_steps
from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.order import SourceOrder, epochs_for
from resilient_slurm.data.tokens.plan import BlockPlan
from resilient_slurm.data.tokens.position import NEW_PHASE
from resilient_slurm.data.tokens.sampler import TokenBatchSampler, ValRows
from resilient_slurm.data.tokens.sources import Source, open_source
from resilient_slurm.data.tokens.tiny_pretrain import resolve_source_path
from resilient_slurm.files import atomic_write
from resilient_slurm.data.chat.dataset import cache_root
from resilient_slurm.data.tokenizer import ChatTokenizer, resolve_path

RECORD = "data.json"
"""In the run directory: each data phase's sources and their files, as the phase first saw them."""


@dataclass
class TokenStats:
    seconds: float = 0.0
    """Opening, from the first file read to the last order mapped."""
    index_seconds: float = 0.0
    """Of which building missing order files (0 when prepared)."""
    index_built: list[str] = field(default_factory=list)
    """The order files this start built, as source/file."""
    tokens: dict[str, int] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "index_seconds": round(self.index_seconds, 3),
                "index_built": list(self.index_built), "tokens": dict(self.tokens), "windows": dict(self.windows)}


class TokenData:
    def __init__(self, cfg: Config, orders: list[SourceOrder], eos_id: int | None, stats: TokenStats) -> None:
        self.cfg = cfg
        self.orders = orders
        self.eos_id = eos_id
        self.stats = stats
        self.val = {o.source.name: ValRows(orders, i, cfg.data.document_mask) for i, o in enumerate(orders)}
        """Per source, its held-out windows (PackedRows' interface: num_rows, batch(rows))."""

    @property
    def sources(self) -> list[Source]:
        return [o.source for o in self.orders]

    def sampler(self, rank: int, world_size: int) -> TokenBatchSampler:
        return TokenBatchSampler(self.orders, self.cfg.data, rank, world_size)


def open_token_data(cfg: Config, run_dir: Path | None = None, rank: int = 0) -> TokenData:
    """Open every source of data.sources and its order; TokenDataError (one line naming the file
    or key) on anything a restart cannot fix. `run_dir`: check and keep the run's data record
    (None: no run, as in `prepare` and the benchmarks); rank 0 writes it."""
    start = time.perf_counter()
    d = cfg.data
    if d.kind != "tokens":
        raise TokenDataError(f"data.kind: {d.kind}; the token pipeline needs data.kind=tokens")
    tokenizer_dir = d.tokenizer or cfg.model.pretrained or cfg.model.config or ""
    eos_id = ChatTokenizer(resolve_path(tokenizer_dir), need_template=False).eos_ids[0] if tokenizer_dir else None
    cache = cache_root(cfg)
    sources = [open_source(s, eos_id, lambda p: resolve_source_path(p, cache)) for s in d.sources]
    if run_dir is not None:
        _check_record(run_dir, d.phase, sources, rank)
    orders = [SourceOrder(s, d.seq_len, cfg.train.seed, d.val_sequences, d.index_dir) for s in sources]
    for o in orders:
        for f, high in zip(o.source.files, o.max_tokens):
            if high >= cfg.model.vocab_size:
                raise TokenDataError(f"{f.path}: token id {high} is >= the model's vocabulary (model.vocab_size="
                                     f"{cfg.model.vocab_size}; source {o.source.name}); tokenize with the model's "
                                     "tokenizer, or use a model whose vocabulary covers it")
    plan = BlockPlan([s.name for s in sources], [s.weight for s in sources])
    needed = plan.consumed(train_steps(cfg) * d.global_batch_size)
    for o, count in zip(orders, needed.tolist()):
        o.ready(epochs_for(count, o.train_windows) if d.on_exhausted == "repeat" else 1)
    stats = TokenStats(
        seconds=time.perf_counter() - start, index_seconds=sum(o.report.seconds for o in orders),
        index_built=[f"{o.source.name}/{f}" for o in orders for f in o.report.built],
        tokens={o.source.name: o.source.num_tokens for o in orders},
        windows={o.source.name: o.windows for o in orders})
    return TokenData(cfg, orders, eos_id, stats)


def _check_record(run_dir: Path, phase: str, sources: list[Source], rank: int) -> None:
    """Refuse files changed within the configured phase (naming the file); record a new phase."""
    path = run_dir / RECORD
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"kind": "tokens", "phases": {}}
    if record.get("kind") != "tokens":
        raise TokenDataError(f"data.kind: tokens, but {run_dir} is a run on chat data; start a new run (run.name)")
    seen = record["phases"].get(phase)
    current: dict[str, dict[str, Any]] = {
        s.name: {"digest": s.digest, "weight": s.weight, "tokens": s.num_tokens, "files": s.identity} for s in sources}
    if seen is None:
        if rank == 0:
            record["phases"][phase] = current
            atomic_write(path, json.dumps(record, indent=1) + "\n")
        return
    added = sorted(set(current) - set(seen))
    if added:
        raise TokenDataError(f"data.sources[{added[0]}]: not a source of data phase {phase!r}, which this run is in; "
                             "remove it, or begin a new data phase from this step (data.phase=NAME)")
    for name, then in seen.items():
        now = current.get(name)
        if now is None:
            raise TokenDataError(f"data.sources: source {name} of data phase {phase!r} is gone; restore it, or begin a "
                                 "new data phase from this step (data.phase=NAME)")
        if now["digest"] != then["digest"]:
            raise TokenDataError(f"data.sources[{name}]: {_file_change(then['files'], now['files'])} since data phase "
                                 f"{phase!r} began; {NEW_PHASE}")
        if now["weight"] != then["weight"]:
            raise TokenDataError(f"data.sources[{name}].weight: {then['weight']:g} -> {now['weight']:g} since data phase "
                                 f"{phase!r} began; set it back, or begin a new data phase (data.phase=NAME)")


def _file_change(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    old = {f["file"]: f for f in before}
    new = {f["file"]: f for f in after}
    for name in sorted(set(old) | set(new)):
        if name not in new:
            return f"{name} is gone"
        if name not in old:
            return f"{name} appeared"
        if old[name] != new[name]:
            return f"{name} is {new[name]['bytes']} bytes, was {old[name]['bytes']}" \
                if old[name]["bytes"] != new[name]["bytes"] else f"{name}'s header changed"
    return "its files were reordered"
