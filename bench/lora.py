"""LoRA vs a full fine-tune of the same model, side by side in one run: checkpoint bytes, save time
and blocking time, memory per rank, tokens/s.

    python bench/lora.py [--ranks 2] [--reps 2] [--steps 6] [--rank 16] [--layers 4] [--dir DIR]

Both modes build the same Llama-shaped model the way a run does (model/parallel.py: meta device,
FSDP2 over `--ranks` gloo ranks, each rank filling its rows), train it on the same synthetic
batches with the project's StepRunner and AdamW, and save with the project's checkpoint code:
- tokens/s: the global batch over the median step time (after 2 warm-up steps);
- memory per rank: the bytes of the tensors a rank holds (parameter shards by dtype, gradient
  shards, AdamW state), and the process's peak RSS (ru_maxrss) after training, which adds
  activations, the all-gathered layers and the Python/torch baseline (~300 MB here);
- checkpoint: bytes of one checkpoint (all ranks), a synchronous save's time (`save`: write,
  fsync, checks, commit), and an async save's blocking time (snapshot + staging into host
  buffers: what the loop waits for) and its time until committed; medians of 3 saves after a
  warm-up save (the first async save allocates its staging buffers).
Each mode runs in fresh processes (so peak RSS is its own), in alternating order over `--reps`
(ABBA), and the table shows medians over reps. This machine has 2 shared cores and a shared disk:
numbers are for these conditions only, ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.async_save import AsyncSaver  # noqa: E402
from resilient_slurm.checkpoint.save import save  # noqa: E402
from resilient_slurm.checkpoint.train_state import TrainState  # noqa: E402
from resilient_slurm.checkpoint.state import capture_snapshot  # noqa: E402
from resilient_slurm.config import LoRAConfig, ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.parallel import fsdp  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.trainer.step import StepRunner  # noqa: E402
from resilient_slurm.data.batches import Batch  # noqa: E402

SEQ, MICRO = 128, 2
SAVES = 3


def model_config(layers: int, rank: int | None) -> ModelConfig:
    return ModelConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_layers=layers, num_heads=8,
                       num_kv_heads=4, max_seq_len=SEQ, lora=LoRAConfig(rank=rank))


def batch(rank: int, step: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(step * 1009 + rank)
    ids = torch.randint(0, vocab, (MICRO, SEQ + 1), generator=g)
    return Batch(ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), torch.arange(SEQ).expand(MICRO, SEQ).contiguous(),
                 torch.zeros(MICRO, SEQ, dtype=torch.long))


def local_bytes(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def worker(rank: int, world: int, port: int, cfg: ModelConfig, steps: int, root: str, queue) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
    model = fsdp.build_model(cfg, comm.mesh, comm.device)
    fsdp.fill_random(model, cfg, 0)
    optim = OptimConfig()
    opt = build_optimizer(model, optim)
    sched = build_scheduler(opt, optim, 1000)
    trainer = StepRunner(model, opt, sched, comm, 1.0)
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        result = trainer.step([batch(rank, step, cfg.vocab_size)])
        if step >= 2:
            times.append(time.perf_counter() - start)
    params = list(model.parameters())
    memory = {
        "params_fp32": local_bytes(p for p in params if p.dtype == torch.float32),
        "params_bf16": local_bytes(p for p in params if p.dtype == torch.bfloat16),
        "grads": local_bytes(p.grad for p in params if p.grad is not None),
        "adam": local_bytes(v for state in opt.state.values() for v in state.values() if v.ndim),
        "rss_train": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    sync_s, blocking_s, committed_s, nbytes = [], [], [], 0
    saver = AsyncSaver(Path(root) / "async", comm, 1 << 30, 2)
    for i in range(SAVES + 1):
        comm.barrier()
        res = save(Path(root) / "sync", 1 + i, capture_snapshot(model, opt, sched, TrainState(step=1 + i)), comm, 1 << 30, 2)
        nbytes = res.nbytes
        if i:
            sync_s.append(res.seconds)
        comm.barrier()
        start = time.perf_counter()
        snap = capture_snapshot(model, opt, sched, TrainState(step=1 + i))
        saver.save(1 + i, snap, lambda r, e, b: None)
        blocked = time.perf_counter() - start
        saver.wait()
        if i:  # the first async save allocates the staging buffers
            blocking_s.append(blocked)
            committed_s.append(time.perf_counter() - start)
    memory["rss_saves"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put((rank, {
        "trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params),
        "step_s": statistics.median(times), "tokens": world * MICRO * SEQ, "loss": result.loss,
        "ckpt_bytes": nbytes, "sync_s": statistics.median(sync_s), "blocking_s": statistics.median(blocking_s),
        "committed_s": statistics.median(committed_s), **memory,
    }))
    comm.close()


def run_mode(cfg: ModelConfig, ranks: int, steps: int, root: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shutil.rmtree(root, ignore_errors=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, ranks, port, cfg, steps, str(root), queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(60)
    shutil.rmtree(root, ignore_errors=True)
    return [results[r] for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=None, help="where checkpoints are written (default: a temp dir)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-lora-"))
    modes = {"full": model_config(args.layers, None), f"lora-r{args.rank}": model_config(args.layers, args.rank)}
    runs: dict[str, list[list[dict]]] = {m: [] for m in modes}
    order = list(modes)
    started = time.perf_counter()
    for rep in range(args.reps):
        for mode in order if rep % 2 == 0 else order[::-1]:
            runs[mode].append(run_mode(modes[mode], args.ranks, args.steps, root / mode))
    elapsed = time.perf_counter() - started

    def med(mode: str, key: str, rank: int = 0) -> float:
        return statistics.median(r[rank][key] for r in runs[mode])

    def per_rank(mode: str, key: str) -> float:
        return max(med(mode, key, r) for r in range(args.ranks))

    mib = 1 << 20
    full, lora = order
    rows = [
        ("trainable / total parameters", lambda m: f"{med(m, 'trainable') / 1e6:.2f}M / {med(m, 'total') / 1e6:.2f}M"),
        ("checkpoint bytes (all ranks)", lambda m: f"{med(m, 'ckpt_bytes') / mib:.2f} MiB"),
        ("sync save, s", lambda m: f"{med(m, 'sync_s'):.3f}"),
        ("async save: blocking, s", lambda m: f"{med(m, 'blocking_s'):.4f}"),
        ("async save: until committed, s", lambda m: f"{med(m, 'committed_s'):.3f}"),
        ("per rank: parameter shards (fp32 + bf16)",
         lambda m: f"{per_rank(m, 'params_fp32') / mib:.1f} + {per_rank(m, 'params_bf16') / mib:.1f} MiB"),
        ("per rank: gradient shards", lambda m: f"{per_rank(m, 'grads') / mib:.2f} MiB"),
        ("per rank: AdamW state", lambda m: f"{per_rank(m, 'adam') / mib:.2f} MiB"),
        ("per rank: peak RSS after training (max over ranks)", lambda m: f"{per_rank(m, 'rss_train') / mib:.0f} MiB"),
        ("per rank: peak RSS after saves (max over ranks)", lambda m: f"{per_rank(m, 'rss_saves') / mib:.0f} MiB"),
        ("step, s (median)", lambda m: f"{med(m, 'step_s'):.3f}"),
        ("tokens/s", lambda m: f"{med(m, 'tokens') / med(m, 'step_s'):.0f}"),
    ]
    ratios = {"checkpoint bytes (all ranks)": "ckpt_bytes", "sync save, s": "sync_s",
              "async save: blocking, s": "blocking_s", "step, s (median)": "step_s"}
    cfg = modes[full]
    print(f"model: d={cfg.hidden_size}, {cfg.num_layers} layers, vocab {cfg.vocab_size}; {args.ranks} gloo ranks, "
          f"{args.ranks * MICRO} x {SEQ} tokens per step, float32 compute; LoRA rank {args.rank} on "
          f"{'/'.join(LoRAConfig().targets)}; medians over {args.reps} reps (ABBA); {elapsed:.0f} s in all\n")
    print(f"| measure | {full} | {lora} | {lora} / {full} |\n|---|---|---|---|")
    for name, cell in rows:
        key = ratios.get(name)
        ratio = f"{med(lora, key) / med(full, key):.3f}" if key else ""
        print(f"| {name} | {cell(full)} | {cell(lora)} | {ratio} |")


if __name__ == "__main__":
    main()
