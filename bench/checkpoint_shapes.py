"""The synchronous save's speed against the disk's, by the shape of the state: which states save
below `dd oflag=direct`, and tensor parallelism over 2 ranks (`bench/checkpoint.py --tp 2` runs
the tp2 state here).

    python bench/checkpoint_shapes.py [--dir DIR] [--reps 5] [--states llama6 llama2 ...] [--json FILE]
                                      [--hidden 1024] [--vocab 32000] [--synthetic-bytes 1710000000]

States, each built alone (the memory is shared), then saved --reps times into fresh directories
(`checkpoint.save.save`, files fsynced, snapshot included as the loop's saves include it), with
`dd bs=64M oflag=direct` of the same bytes before the save in even reps and after it in odd ones:
    llama6        bench/checkpoint.py's default state: a Llama-shaped model (6 layers, hidden 1024,
                  vocab 32000: 142.6M parameters) under FSDP2 on one rank, with its AdamW state after
                  one step: 1.71 GB in 228 tensors
    llama2        the same with 2 layers (90M parameters): 1.08 GB in 84 tensors
    few           1.71 GB of float32 as 16 tensors
    few-1.1       1.08 GB as 16 tensors (llama2's bytes: the size alone, without llama's tensors)
    many          1.71 GB as 4096 tensors of 416 KiB
    llama6-files  llama6 written with max_shard_bytes of 131 MB (15 files instead of 3)
    tp2           llama6 as a run with tensor parallelism 2 builds it (`parallel/`: attention and MLP
                  column- and row-wise, a vocabulary-parallel embedding and head, norms replicated:
                  their chunks are written once, by either rank), 2 gloo ranks saving at once;
                  timed from a barrier to the end of the collective commit, against one dd of the
                  checkpoint's total bytes
The save's time is split into its plan (the snapshot, the ranks' agreement, the file list) and
the rest (writing, fsync, commit). Medians, and the range. Holds on this machine kind only (2
shared cores, one virtio disk whose speed swings between runs): read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.save import save  # noqa: E402
from resilient_slurm.checkpoint.state import Snapshot, capture_snapshot, held  # noqa: E402
from resilient_slurm.checkpoint.train_state import TrainState  # noqa: E402
from resilient_slurm.config import ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.parallel import fsdp  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer  # noqa: E402

STATES = ("llama6", "llama2", "few", "few-1.1", "many", "llama6-files", "tp2")
IO_THREADS = 4


def llama(layers: int, hidden: int = 1024, vocab: int = 32000) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_layers=layers,
                       num_heads=max(hidden // 64, 1), num_kv_heads=max(hidden // 64, 1), max_seq_len=64)


def with_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW with its state: one step on zero gradients (the state's shapes are what matter)."""
    opt = build_optimizer(model, OptimConfig())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()
    return opt


def synthetic(count: int, total: int) -> Snapshot:
    per = total // count // 4
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i:05d}": torch.randn(per, generator=g) for i in range(count)}
    return Snapshot({n: held(t, n) for n, t in tensors.items()}, {}, {},
                    {"train_state.json": TrainState(step=1).to_json()})


def dd_direct(d: Path, size: int) -> float:
    n = max(size >> 26, 1)
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={d / 'dd.bin'}", "bs=64M", f"count={n}", "oflag=direct"], check=True,
                   capture_output=True)
    seconds = time.perf_counter() - start
    (d / "dd.bin").unlink()
    return seconds * size / (n << 26)  # the time for `size` bytes at dd's rate


def timed_save(d: Path, snap_of: Any, comm: Comm, max_shard_bytes: int) -> tuple[float, float, int, int]:
    """(total s, plan s, bytes, files) of one synchronous save into a fresh directory."""
    comm.barrier()
    start = time.perf_counter()
    result = save(d, 1, snap_of(), comm, max_shard_bytes, IO_THREADS)
    total = time.perf_counter() - start
    files = sum(1 for rel in result.manifest.files if rel.endswith(".safetensors"))
    tensor_bytes = sum(e.nbytes for rel, e in result.manifest.files.items() if rel.endswith(".safetensors"))
    return total, total - result.seconds, tensor_bytes, files


def run_state(name: str, comm: Comm, base: Path, reps: int, size: tuple[int, int, int]) -> dict[str, Any] | None:
    """Reps of one state on this rank; rank 0 returns the row. `size`: hidden, vocab, synthetic bytes."""
    hidden, vocab, synthetic_bytes = size
    max_shard = 1 << 30
    if name in ("llama6", "llama2", "llama6-files"):
        cfg = llama(6 if name != "llama2" else 2, hidden, vocab)
        model = fsdp.build_model(cfg, comm.mesh, comm.device)
        fsdp.fill_random(model, cfg, seed=0)
        opt = with_adamw(model)
        max_shard = max(1 << 20, synthetic_bytes // 13) if name == "llama6-files" else max_shard

        def snap_of() -> Snapshot:
            return capture_snapshot(model, opt, None, TrainState(step=1))
    elif name == "tp2":
        model = tensor_parallel(llama(6, hidden, vocab), comm)
        opt = with_adamw(model)

        def snap_of() -> Snapshot:
            return capture_snapshot(model, opt, None, TrainState(step=1))
    else:
        total = synthetic_bytes * 108 // 171 if name == "few-1.1" else synthetic_bytes
        fixed = synthetic(4096 if name == "many" else 16, total)

        def snap_of() -> Snapshot:
            return fixed
    # A first save, untimed: it learns the bytes, and pays what only a run's first save pays (the
    # ranks' exchange of what they hold, the writers' buffers), as bench/checkpoint.py's warm-up does.
    _, _, nbytes, files = timed_save(base / f"{name}-warm", snap_of, comm, max_shard)
    rows = []
    for rep in range(reps):
        dd_s = dd_direct(base, nbytes) if rep % 2 == 0 and comm.rank == 0 else None
        total, plan_s, _, _ = timed_save(base / f"{name}-{rep}", snap_of, comm, max_shard)
        comm.barrier()
        if comm.rank == 0:
            dd_s = dd_s if dd_s is not None else dd_direct(base, nbytes)
            rows.append((total, plan_s, dd_s))
        comm.barrier()
    if comm.rank == 0:
        for d in base.glob(f"{name}-*"):
            shutil.rmtree(d)
    if comm.rank != 0:
        return None
    tensors = len(snap_of().model) + len(snap_of().optimizer)
    save_s = statistics.median(r[0] for r in rows)
    dd_s = statistics.median(r[2] for r in rows)
    return {"state": name, "bytes": nbytes, "tensors": tensors, "files": files, "save_s": round(save_s, 3),
            "plan_s": round(statistics.median(r[1] for r in rows), 4), "dd_direct_s": round(dd_s, 3),
            "vs_dd_direct": round(dd_s / save_s, 3),
            "range": [round(min(r[2] / r[0] for r in rows), 3), round(max(r[2] / r[0] for r in rows), 3)]}


def tensor_parallel(cfg: ModelConfig, comm: Comm) -> torch.nn.Module:
    """The model as a run at tp=2 builds it (`parallel/`: TP, then FSDP2 over the data-parallel
    dimension, here of size one), with its random initial weights."""
    from resilient_slurm.config import Layout
    from resilient_slurm.parallel.mesh import ParallelMesh

    mesh = ParallelMesh(Layout(dp_replicate=1, dp_shard=1, tp=2, pp=1), "cpu", comm.rank)
    model = fsdp.build_model(cfg, mesh.dp, comm.device, tp=mesh.tp)
    fsdp.fill_random(model, cfg, seed=0)
    return model


def worker(rank: int, world: int, port: int, states: list[str], base: str, reps: int, out: str,
           size: tuple[int, int, int]) -> None:
    torch.set_num_threads(1 if world > 1 else os.cpu_count() or 1)
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
    rows = []
    for name in states:
        row = run_state(name, comm, Path(base), reps, size)
        if row is not None:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.barrier()
    comm.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--states", nargs="+", choices=STATES, default=list(STATES))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--hidden", type=int, default=1024, help="the llama states' width")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--synthetic-bytes", type=int, default=1_710_000_000, help="few and many: their bytes")
    args = parser.parse_args()
    size = (args.hidden, args.vocab, args.synthetic_bytes)
    base = Path(tempfile.mkdtemp(prefix="ckpt-shapes-", dir=args.dir))
    out = base / "rows.json"
    rows: list[dict[str, Any]] = []
    try:
        for world, states in ((1, [s for s in args.states if s != "tp2"]), (2, [s for s in args.states if s == "tp2"])):
            if states:
                mp.spawn(worker, args=(world, free_port(), states, str(base), args.reps, str(out), size), nprocs=world)
                rows += json.loads(out.read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(rows, args.reps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def report(rows: list[dict[str, Any]], reps: int) -> None:
    print()
    print("| state | GB | tensors | files | sync save s | of which plan s | dd direct s | x dd direct (range) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['state']} | {r['bytes'] / 1e9:.2f} | {r['tensors']} | {r['files']} | {r['save_s']:.2f} | "
              f"{r['plan_s']:.3f} | {r['dd_direct_s']:.2f} | {r['vs_dd_direct']:.2f} "
              f"({r['range'][0]:.2f}-{r['range'][1]:.2f}) |")
    print(f"medians of {reps}; dd bs=64M oflag=direct of the same bytes, alternately before and after each save")
    for r in rows:
        ok = r["vs_dd_direct"] >= 0.85
        print(f"{'met    ' if ok else 'NOT met'}  {r['state']}: sync save >= 0.85x dd oflag=direct: {r['vs_dd_direct']:.3f}")


if __name__ == "__main__":
    main()
