"""`launch --plan`: what a run will hold and move, printed before anything starts (no torch). Pure.

The numbers are parallel/estimate.py's: the layout, the memory of the most-loaded GPU (parameters,
gradients, AdamW state, activations with and without activation checkpointing, FSDP2's gathers and
the logits), the global batch, the bytes each rank writes per checkpoint, and the collectives of a
step with their group sizes.
"""

from __future__ import annotations

from resilient_slurm.config import Config, Layout, train_steps
from resilient_slurm.config.cluster import world_size
from resilient_slurm.parallel import estimate

GIB = 1024**3


def render(cfg: Config, lay: Layout) -> str:
    m, d, k = cfg.model, cfg.data, cfg.cluster
    params = estimate.all_params(m)
    total = sum(p.numel for p in params)
    trained = sum(p.numel for p in params if p.trainable)
    static = estimate.static_bytes(m, lay)
    act = estimate.activation_bytes(m, lay, d.seq_len, d.micro_batch_size, documents=_documents(cfg))
    transient = estimate.transient_bytes(m, lay, d.seq_len, d.micro_batch_size)
    checkpointed = m.activation_checkpointing
    peak = static.total + act.total(checkpointed) + transient
    tokens = d.global_batch_size * d.seq_len
    micro = d.global_batch_size // max(d.micro_batch_size * lay.dp, 1)
    where = (f"{k.nodes:,} node(s) x {k.tasks_per_node} (+{k.spare_nodes} spare)" if k.kind == "slurm"
             else f"{k.ranks} local rank(s)")
    ckpt = estimate.checkpoint_bytes(m, lay)
    lines = [
        f"plan for {cfg.run.experiment} (nothing started, nothing written)",
        f"layout: {world_size(k):,} rank(s) = {lay.describe()}; {where}",
        f"model: {m.name}, {_count(total)} parameters ({_count(trained)} trained), {m.dtype} compute, "
        f"activation checkpointing {'on' if checkpointed else 'off'}{', compiled blocks' if m.compile else ''}",
        f"global batch: {d.global_batch_size:,} sequences x {d.seq_len:,} = {tokens:,} tokens per step; {micro} "
        f"micro-batch(es) of {d.micro_batch_size} per data-parallel group; {train_steps(cfg):,} steps",
        "memory per GPU (the most-loaded rank):",
        *(f"  {what:<48} {_binary(n):>11}" for what, n in (
            (f"parameters (fp32 master{', frozen base bf16' if m.lora.rank else ''})", static.params),
            ("gradients (fp32)", static.grads),
            ("optimizer state (AdamW, fp32)", static.optimizer),
            ("activations, one micro-batch, AC on", act.total(True)),
            ("activations, one micro-batch, AC off", act.total(False)),
            ("FSDP2 gathers, a layer's gradients, the logits", transient),
            (f"peak estimate (AC {'on' if checkpointed else 'off'})", peak))),
        f"checkpoint: {_size(ckpt)} written per rank per save, {_size(ckpt * lay.world_size)} in all "
        f"(fp32 weights and AdamW moments, each chunk once)",
        "collectives per step, on each rank (group, ranks in it, how many, bytes of the whole tensors):",
    ]
    for c in estimate.collectives(cfg, lay):
        lines.append(f"  {c.what:<52} {c.group:>12} of {c.size:>6,}  x{c.count:>6,}  {_size(c.nbytes):>10}")
    lines.append("Float8 matmuls are not planned: they stay out until a GPU is lent to test them.")
    return "\n".join(lines) + "\n"


def _documents(cfg: Config) -> bool:
    """Whether the training rows carry document ids (SDPA then gets a mask)."""
    return cfg.data.kind == "chat" or cfg.data.document_mask


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _binary(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
