"""Checkpoint speed, side by side in one run: the project's checkpoint (sync and async) vs torch.save,
safetensors save_file and torch.distributed.checkpoint (sync and async), next to the disk's own
write speed.

    python bench/checkpoint.py [--dir DIR] [--layers 8] [--reps 5] [--json FILE]

`--json FILE` also writes the project's measured costs (medians: sync save, async blocking and
training time lost, restore, bytes) for `python -m resilient_slurm.simulate --from-bench FILE`.
The simulator reads these keys (all listed, with their meanings, in resilient_slurm/simulate/bench.py),
seconds unless named otherwise, for one rank's shard:
    bytes              bytes one rank saves
    save_s             a synchronous save, start to committed
    blocking_s         an async save: the loop blocked until the call returned
    lost_s             an async save: blocked plus the training slowdown while it wrote (preferred)
    load_s             restore from the hot tier into the training objects
    cold_load_s        restore from the cold tier
and, for the memory tier (issue 23; the bench writes them once it measures the tier):
    memory_bytes       bytes one rank keeps in the memory tier (default: bytes)
    memory_blocking_s  a memory-tier save: the loop blocked (the device->host copy)
    memory_save_s      a memory-tier save until the own node's and the buddy's copies are committed
    memory_load_s      restore from the own node's memory tier
    buddy_load_s       restore from the buddy node's memory tier
`--scale-to 8b-h100` scales the byte-bound ones from `bytes` (or `memory_bytes`) on this machine to
an 8B model's shard per GPU on H100 nodes (resilient_slurm/simulate/scaling.py).

The payload is a Llama-shaped fp32 model plus its real AdamW state after one step (2.0 GB with 8
layers). Methodology:
- every save goes to a fresh directory and includes fsync of its files (DCP: sync_files=True);
- every restore ends with the state in the training objects (model parameters, optimizer state),
  the way a resume needs it, and runs cold: the page cache is dropped first (needs root; the
  table says "warm" otherwise);
- async: "blocking" is until the call returns (the loop is free again), "durable" until the
  checkpoint is committed (project) or the future completes (DCP). Both stagers are warm: reused
  for the whole run, after two warm-up saves each (the first save of each allocates its buffers);
- interference: a matmul loop in the training thread; its rate while a background save runs,
  relative to its idle rate measured just before, and the training time a save costs in all
  (blocked, plus the slowdown over the background part);
- methods run in a rotated order each rep, and the table shows medians, because this machine's
  disk swings 2-5x between reps; dd is measured in the same run, in the same reps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.async_save import AsyncSaver  # noqa: E402
from resilient_slurm.checkpoint.load import load_into  # noqa: E402
from resilient_slurm.checkpoint.save import save  # noqa: E402
from resilient_slurm.checkpoint.train_state import TrainState  # noqa: E402
from resilient_slurm.checkpoint.state import (  # noqa: E402
    Snapshot,
    capture_snapshot,
    model_tensors,
    optimizer_tensors,
    param_names,
)
from resilient_slurm.checkpoint.verify import verify  # noqa: E402
from resilient_slurm.config import CheckpointConfig, ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.runtime.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.runtime.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.model.decoder import plain_model  # noqa: E402

SAVES = ("project", "torch.save", "safetensors", "DCP")
ASYNC = ("project", "DCP")


def payload(layers: int):
    cfg = ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_layers=layers, num_heads=16,
                      num_kv_heads=16, max_seq_len=64)
    model = plain_model(cfg, seed=0)
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), 100)
    model(torch.randint(0, cfg.vocab_size, (1, 16))).float().mean().backward()
    opt.step()
    sched.step()
    for p in model.parameters():
        p.grad = None
    return model, opt, sched


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def dd(d: Path, size: int, direct: bool) -> float:
    target = d / "dd.bin"
    if direct:
        args = ["bs=64M", f"count={size >> 26}", "oflag=direct"]
    else:
        args = ["bs=1M", f"count={size >> 20}", "conv=fdatasync"]
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", *args], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


class Methods:
    """Each save writes the same state into a fresh directory; each restore puts it back in the objects."""

    def __init__(self, model, opt, sched, cfg: CheckpointConfig, store_dir: Path) -> None:
        self.model, self.opt, self.sched, self.cfg = model, opt, sched, cfg
        self.names = param_names(model)
        self.comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", 0))
        self.saver = AsyncSaver(store_dir, self.comm, cfg.max_shard_bytes, cfg.io_threads)
        # DCP's async_save wants a (CPU) process group; a reused stager keeps its buffers (warm).
        dist.init_process_group("gloo", init_method=f"file://{store_dir}/pg-store", rank=0, world_size=1)
        self.stager = DefaultStager(StagingOptions(False, False, False, False))

    def snapshot(self) -> Snapshot:
        return capture_snapshot(self.model, self.opt, self.sched, TrainState(step=1))

    def dcp_state(self) -> dict:
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    # --- synchronous saves
    def save_project(self, d: Path) -> None:
        save(d, 1, self.snapshot(), self.comm, self.cfg.max_shard_bytes, self.cfg.io_threads)

    def save_torch(self, d: Path) -> None:
        d.mkdir(parents=True)
        with open(d / "ckpt.pt", "wb") as f:
            torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    def save_safetensors(self, d: Path) -> None:
        d.mkdir(parents=True)
        save_file({n: h.data for n, h in model_tensors(self.model).items()}, str(d / "model.safetensors"))
        optim = optimizer_tensors(self.opt, self.names)
        for key in ("exp_avg", "exp_avg_sq"):
            part = {n: t for n, t in optim.items() if n.endswith(key) or (key == "exp_avg" and n.endswith(".step"))}
            save_file(part, str(d / f"optim-{key}.safetensors"))
        for f in d.iterdir():
            fsync_path(f)

    def save_dcp(self, d: Path) -> None:
        dcp.save(self.dcp_state(), storage_writer=dcp.FileSystemWriter(str(d), thread_count=1, sync_files=True))

    # --- async saves: (blocking s, the `done` poll)
    def async_project(self, d: Path) -> tuple[float, Callable[[], bool]]:
        self.saver.root = d
        failures: list[str] = []
        blocking = self.saver.save(1, self.snapshot(), lambda _r, error, _b: failures.append(error) if error else None)

        def done() -> bool:
            if self.saver.busy:
                return False
            if failures:
                raise RuntimeError(failures[0])
            return True

        return blocking, done

    def async_dcp(self, d: Path) -> tuple[float, Callable[[], bool]]:
        start = time.perf_counter()
        writer = dcp.FileSystemWriter(str(d), thread_count=1, sync_files=True)
        future = dcp.async_save(self.dcp_state(), storage_writer=writer,
                                async_checkpointer_type=AsyncCheckpointerType.THREAD, async_stager=self.stager)
        blocking = time.perf_counter() - start

        def done() -> bool:
            if future.done():
                future.result()
                return True
            return False

        return blocking, done

    # --- restores
    def load_project(self, d: Path) -> None:
        path = d / "step_00000001"
        verdict = verify(path, checksums=False)
        load_into(path, verdict.manifest, 0, self.model, self.opt, self.sched, self.cfg.io_threads)

    def load_torch(self, d: Path) -> None:
        state = torch.load(d / "ckpt.pt", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])

    def load_safetensors(self, d: Path) -> None:
        self.model.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
        flat = {**load_file(str(d / "optim-exp_avg.safetensors")), **load_file(str(d / "optim-exp_avg_sq.safetensors"))}
        by_name = {n: p for p, n in self.names.items()}
        for name, t in flat.items():
            pname, key = name.rsplit(".", 1)
            self.opt.state[by_name[pname]][key].copy_(t)

    def load_dcp(self, d: Path) -> None:
        state = self.dcp_state()
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(d)))
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def close(self) -> None:
        self.saver.wait()
        self.stager.close()
        dist.destroy_process_group()


class Matmul:
    """Stands for training compute: how much a background save slows the training thread."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.a, self.b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)

    def rate(self, until: Callable[[], bool]) -> float:
        start, n = time.perf_counter(), 0
        while not until():
            torch.mm(self.a, self.b)
            n += 1
        return n / max(time.perf_counter() - start, 1e-9)

    def idle_rate(self, seconds: float = 1.0) -> float:
        end = time.perf_counter() + seconds
        return self.rate(lambda: time.perf_counter() >= end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--layers", type=int, default=8, help="model depth (8 layers: 2.0 GB with AdamW state)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the project's measured costs here")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    torch.set_num_threads(os.cpu_count() or 1)

    model, opt, sched = payload(args.layers)
    m = Methods(model, opt, sched, CheckpointConfig(), base)
    snap = m.snapshot()
    size = sum(h.spec.nbytes for h in [*snap.model.values(), *snap.optimizer.values()])
    gb = size / 1e9
    saves = {"project": m.save_project, "torch.save": m.save_torch, "safetensors": m.save_safetensors,
             "DCP": m.save_dcp}
    loads = {"project": m.load_project, "torch.save": m.load_torch, "safetensors": m.load_safetensors,
             "DCP": m.load_dcp}
    asyncs = {"project": m.async_project, "DCP": m.async_dcp}
    mm = Matmul()
    t: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        t.setdefault(key, []).append(value)

    print(f"payload: {gb:.2f} GB (model + AdamW state), {args.reps} reps, dir {base}", flush=True)
    for name, start_async in asyncs.items():  # warm-up: the first saves allocate the stagers' buffers
        for i in range(2):
            blocking, done = start_async(base / f"warm-{name}-{i}")
            if i == 0:
                record(f"first blocking {name}", blocking)
            mm.rate(done)
            shutil.rmtree(base / f"warm-{name}-{i}")
    cold = True
    for rep in range(args.reps):
        order = list(SAVES)[rep % len(SAVES):] + list(SAVES)[: rep % len(SAVES)]
        record("dd", dd(base, size, direct=False))
        record("dd direct", dd(base, size, direct=True))
        for name in order:
            d = base / f"{name}-{rep}"
            start = time.perf_counter()
            saves[name](d)
            record(f"save {name}", time.perf_counter() - start)
            if name in asyncs:
                d_async = base / f"{name}-async-{rep}"
                start = time.perf_counter()
                blocking, done = asyncs[name](d_async)
                while not done():
                    time.sleep(0.002)
                record(f"durable {name}", time.perf_counter() - start)
                record(f"blocking {name}", blocking)
                shutil.rmtree(d_async)
                idle = mm.idle_rate()
                start = time.perf_counter()
                blocking, done = asyncs[name](d_async)
                background_start = time.perf_counter()
                rate = mm.rate(done)
                background = time.perf_counter() - background_start
                record(f"slowdown {name}", rate / idle)
                # Compute the training thread lost to this save: blocked, then slowed down.
                record(f"lost {name}", blocking + (1 - rate / idle) * background)
                shutil.rmtree(d_async)
        for name in order:
            d = base / f"{name}-{rep}"
            cold = drop_caches() and cold
            start = time.perf_counter()
            loads[name](d)
            record(f"load {name}", time.perf_counter() - start)
            shutil.rmtree(d)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in t.items()), flush=True)
    m.close()
    shutil.rmtree(base, ignore_errors=True)
    report(t, gb, "cold" if cold else "warm")
    if args.json:
        write_costs(args.json, t, size, "cold" if cold else "warm")


def write_costs(path: Path, t: dict[str, list[float]], size: int, kind: str) -> None:
    """The project's costs, in the keys `resilient_slurm.simulate --from-bench` reads."""
    med = {k: statistics.median(v) for k, v in t.items()}
    costs = {
        "source": "bench/checkpoint.py",
        "bytes": size,
        "save_s": round(med["save project"], 4),
        "durable_s": round(med["durable project"], 4),
        "blocking_s": round(med["blocking project"], 4),
        "lost_s": round(med["lost project"], 4),
        "load_s": round(med["load project"], 4),
        "load_cache": kind,
        "reps": len(t["save project"]),
        "note": "one process on this machine's disk: holds for a rank whose shard is this size on this storage",
    }
    path.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"costs for the simulator: {path}")


def report(t: dict[str, list[float]], gb: float, kind: str) -> None:
    med = {k: statistics.median(v) for k, v in t.items()}
    n = len(t["dd"])
    print()
    print(f"disk, same run (median of {n}): dd bs=1M conv=fdatasync {gb / med['dd']:.2f} GB/s; "
          f"dd bs=64M oflag=direct {gb / med['dd direct']:.2f} GB/s")
    print(f"| method | sync save s | GB/s | x save_file | x DCP t=1 | async blocking s | async durable s | "
          f"restore ({kind}) s | GB/s | x DCP reader | x torch.load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in SAVES:
        s, lo = med[f"save {name}"], med[f"load {name}"]
        blocking = f"{med[f'blocking {name}']:.3f}" if name in ASYNC else "-"
        durable = f"{med[f'durable {name}']:.2f}" if name in ASYNC else "-"
        print(f"| {name} | {s:.2f} | {gb / s:.2f} | {med['save safetensors'] / s:.2f} | {med['save DCP'] / s:.2f} | "
              f"{blocking} | {durable} | {lo:.2f} | {gb / lo:.2f} | {med['load DCP'] / lo:.2f} | "
              f"{med['load torch.save'] / lo:.2f} |")
    print("DCP: FileSystemWriter(thread_count=1) / FileSystemReader; async_save THREAD with a reused "
          "DefaultStager(StagingOptions(False, False, False, False)).")
    print(f"async, first save of a run (allocates the stager's buffers): blocking project "
          f"{t['first blocking project'][0]:.2f} s, DCP {t['first blocking DCP'][0]:.2f} s")
    print(f"training-thread matmul rate during the background part of an async save, vs idle: "
          f"project {med['slowdown project']:.2f}, DCP {med['slowdown DCP']:.2f}; training time lost per save "
          f"(blocked + slowed): project {med['lost project']:.2f} s, DCP {med['lost DCP']:.2f} s")
    print()
    p = "project"
    checks = [
        ("sync save >= 1.3x safetensors.save_file", med["save safetensors"] / med[f"save {p}"], 1.3, True),
        ("sync save >= 2.5x DCP FileSystemWriter t=1", med["save DCP"] / med[f"save {p}"], 2.5, True),
        ("async blocking <= 1/10 of the project's sync save", med[f"blocking {p}"] / med[f"save {p}"], 0.1, False),
        ("async blocking <= 1/10 of DCP's sync save", med[f"blocking {p}"] / med["save DCP"], 0.1, False),
        ("async blocking <= DCP async_save blocking (warm stager)", med[f"blocking {p}"] / med["blocking DCP"],
         1.0, False),
        ("time until durable <= 1.2x the sync save", med[f"durable {p}"] / med[f"save {p}"], 1.2, False),
        (f"{kind} restore >= 1.2x DCP FileSystemReader", med["load DCP"] / med[f"load {p}"], 1.2, True),
        (f"{kind} restore >= 3x eager torch.load", med["load torch.save"] / med[f"load {p}"], 3.0, True),
        ("training slowed by a background save no more than by DCP's (rate while saving)",
         med[f"slowdown {p}"] / med["slowdown DCP"], 1.0, True),
        ("training time lost per async save no more than with DCP's", med[f"lost {p}"] / med["lost DCP"], 1.0, False),
    ]
    for label, value, limit, at_least in checks:
        ok = value >= limit if at_least else value <= limit
        print(f"{'met    ' if ok else 'NOT met'}  {label}: {value:.3f} ({'>=' if at_least else '<='} {limit})")


if __name__ == "__main__":
    main()
