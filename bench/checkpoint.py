"""Checkpoint speed, side by side in one run: the project's checkpoint (sync, async, and the memory
tier) vs torch.save, safetensors save_file and torch.distributed.checkpoint (sync and async), next
to the disk's own write speed (dd, in the same rotation).

    python bench/checkpoint.py [--dir DIR] [--memory-dir /dev/shm] [--layers 6] [--hidden 1024]
                               [--vocab 32000] [--reps 5] [--warm] [--json FILE] [--tp 2]

`--tp 2` measures the synchronous save of the same model with tensor parallelism over 2 ranks
against dd oflag=direct instead (bench/checkpoint_shapes.py's tp2 state, which says how).

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

The payload is the state a run saves: a Llama-shaped fp32 model under FSDP2 on one rank (gloo)
with its AdamW state after one step, as `capture_snapshot` makes it (6 layers: 142.6M parameters,
1.71 GB; 8 layers: 2.0 GB). Methodology:
- every save goes to a fresh directory and includes fsync of its files (DCP: sync_files=True);
  "save" times include taking the snapshot, as the loop's saves do;
- every restore ends with the state in the training objects (parameters, optimizer state), the way
  a resume needs it, and runs cold: the page cache is dropped first (needs root; the table says
  "warm" otherwise). The memory tier's restore reads tmpfs, which no cache drop empties;
- async: "blocking" is until the call returns (the loop is free again), "durable" until the
  checkpoint is committed (project) or the future completes (DCP). Both stagers are warm: reused
  for the whole run, after two warm-up saves each (the first save of each allocates its buffers).
  The project's blocking is split into its parts: the snapshot, the plan (the ranks' agreement,
  file names, headers and JSON: `exchange.agree`, `rank_files`) and the copy into the staging buffers;
- the memory tier (`checkpoint/memory.py`, to files under --memory-dir, one node, so no buddy
  copy): "blocking" is until `save` returns; "copy" until the state's bytes are out of the tensors
  (what an optimizer step issued at once would wait for, at most); "durable" until committed in
  memory; its restore loads the newest memory checkpoint back into the objects;
- interference: a matmul loop in the training thread; its rate while a background save runs,
  relative to its idle rate measured just before, and the training time a save costs in all
  (blocked, plus the slowdown over the background part);
- methods run in a rotated order each rep, and the table shows medians, because this machine's
  disk swings 2-5x between reps; dd (`bs=1M conv=fdatasync`, and `bs=64M oflag=direct`) is
  measured in the same rotation, with the same bytes.

`--json FILE` writes the project's measured costs (medians, seconds unless named otherwise) for
`python -m resilient_slurm.simulate --from-bench FILE`:
    bytes             the checkpoint's bytes (model + AdamW state)
    save_s            a synchronous save (snapshot included)
    durable_s         an async save, from the call until committed
    blocking_s        an async save, the time the loop is blocked (snapshot included)
    lost_s            an async save, training time lost: blocked plus slowed down while it writes
    load_s            a restore from disk (load_cache says whether the page cache was dropped)
    dd_direct_gb_s    the disk: dd bs=64M oflag=direct, GB/s (10^9 bytes)
    sync_vs_dd_direct the sync save's GB/s over dd oflag=direct's
    memory_blocking_s the memory tier: the time its save call blocks the loop (snapshot included)
    memory_copy_s     the memory tier: from the call until the bytes are out of the tensors
    memory_save_s     the memory tier: from the call until committed in host memory
    memory_lost_s     the memory tier: training time lost (blocked plus slowed down)
    memory_load_s     a restore from the memory tier (own node)
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
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.async_save import AsyncSaver  # noqa: E402
from resilient_slurm.checkpoint.exchange import agree  # noqa: E402
from resilient_slurm.checkpoint.load import load_into  # noqa: E402
from resilient_slurm.checkpoint.memory import MemoryTier  # noqa: E402
from resilient_slurm.checkpoint.nodes import Spread  # noqa: E402
from resilient_slurm.checkpoint.exchange import agree  # noqa: E402
from resilient_slurm.checkpoint.save import rank_files, save  # noqa: E402
from resilient_slurm.checkpoint.state import Snapshot, capture_snapshot  # noqa: E402
from resilient_slurm.checkpoint.train_state import TrainState  # noqa: E402
from resilient_slurm.checkpoint.verify import verify  # noqa: E402
from resilient_slurm.config import CheckpointConfig, MemoryTierConfig, ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.parallel import fsdp  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.model.decoder import token_loss_sum  # noqa: E402

SAVES = ("project", "torch.save", "safetensors", "DCP")
ASYNC = ("project", "DCP")
ROTATION = ("dd", "dd direct", *SAVES, "memory")
"""What each rep runs, in an order rotated every rep."""


def payload(comm: Comm, layers: int, hidden: int, vocab: int):
    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_layers=layers,
                      num_heads=max(hidden // 64, 1), num_kv_heads=max(hidden // 64, 1), max_seq_len=64)
    model = fsdp.build_model(cfg, comm.mesh, comm.device)
    fsdp.fill_random(model, cfg, seed=0)
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), 100)
    ids = torch.randint(0, vocab, (1, 17))
    token_loss_sum(model(ids[:, :-1]), ids[:, 1:]).backward()
    opt.step()
    sched.step()
    opt.zero_grad()
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


def dd_bytes(size: int, direct: bool) -> int:
    """What dd writes of `size` bytes: whole blocks (64 MiB direct, else 1 MiB), at least one."""
    block = 1 << 26 if direct else 1 << 20
    return max(size // block, 1) * block


def dd(d: Path, size: int, direct: bool) -> float:
    target = d / "dd.bin"
    n = dd_bytes(size, direct)
    args = ["bs=64M", f"count={n >> 26}", "oflag=direct"] if direct else ["bs=1M", f"count={n >> 20}", "conv=fdatasync"]
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", *args], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


class Methods:
    """Each save writes the same state into a fresh directory; each restore puts it back in the objects."""

    def __init__(self, comm: Comm, model, opt, sched, cfg: CheckpointConfig, store_dir: Path) -> None:
        self.comm, self.model, self.opt, self.sched, self.cfg = comm, model, opt, sched, cfg
        self.saver = AsyncSaver(store_dir, comm, cfg.max_shard_bytes, cfg.io_threads)
        # The memory tier of a run at <store_dir>/bench/memory; one node, so no buddy copies.
        self.memory = MemoryTier(store_dir / "bench" / "memory", cfg, comm, Spread((comm.node,)), None, 300.0)
        # DCP's async_save wants a CPU process group: the Comm's default one is gloo. A reused
        # stager keeps its buffers (warm).
        self.stager = DefaultStager(StagingOptions(False, False, False, False))
        self.step = 0

    def snapshot(self) -> Snapshot:
        return capture_snapshot(self.model, self.opt, self.sched, TrainState(step=1))

    def local_state(self) -> dict[str, torch.Tensor]:
        """The rank's own tensors by name (what torch.save and save_file get)."""
        snap = self.snapshot()
        return {n: h.data for n, h in [*snap.model.items(), *snap.optimizer.items()]}

    def dcp_state(self) -> dict:
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    # --- synchronous saves
    def save_project(self, d: Path) -> None:
        save(d, 1, self.snapshot(), self.comm, self.cfg.max_shard_bytes, self.cfg.io_threads)

    def save_torch(self, d: Path) -> None:
        d.mkdir(parents=True)
        with open(d / "ckpt.pt", "wb") as f:
            torch.save(self.local_state(), f)
            f.flush()
            os.fsync(f.fileno())

    def save_safetensors(self, d: Path) -> None:
        d.mkdir(parents=True)
        snap = self.snapshot()
        save_file({n: h.data for n, h in snap.model.items()}, str(d / "model.safetensors"))
        save_file({n: h.data for n, h in snap.optimizer.items()}, str(d / "optimizer.safetensors"))
        for f in d.iterdir():
            fsync_path(f)

    def save_dcp(self, d: Path) -> None:
        dcp.save(self.dcp_state(), storage_writer=dcp.FileSystemWriter(str(d), thread_count=1, sync_files=True))

    # --- async saves: (blocking s, the `done` poll)
    def async_project(self, d: Path) -> tuple[float, Callable[[], bool]]:
        start = time.perf_counter()
        self.saver.root = d
        failures: list[str] = []
        self.saver.save(1, self.snapshot(), lambda _r, error, _b: failures.append(error) if error else None)
        blocking = time.perf_counter() - start

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

    def async_memory(self) -> tuple[float, Callable[[], bool]]:
        self.step += 1
        start = time.perf_counter()
        self.memory.save(self.step, self.snapshot())
        blocking = time.perf_counter() - start

        def done() -> bool:
            alive = self.memory._thread is not None and self.memory._thread.is_alive()
            return not alive

        return blocking, done

    def blocking_parts(self) -> tuple[float, float]:
        """(snapshot, plan) seconds of one save: what an async save blocks for besides its copy."""
        start = time.perf_counter()
        snap = self.snapshot()
        taken = time.perf_counter()
        rank_files(snap, agree(snap, self.comm, self.cfg.max_shard_bytes), 0)
        return taken - start, time.perf_counter() - taken

    # --- restores
    def load_project(self, d: Path) -> None:
        path = d / "step_00000001"
        verdict = verify(path, checksums=False)
        load_into(path, verdict.manifest, 0, self.model, self.opt, self.sched, self.cfg.io_threads)

    def load_torch(self, d: Path) -> None:
        self.copy_in(torch.load(d / "ckpt.pt", weights_only=True))

    def load_safetensors(self, d: Path) -> None:
        self.copy_in({**load_file(str(d / "model.safetensors")), **load_file(str(d / "optimizer.safetensors"))})

    def copy_in(self, loaded: dict[str, torch.Tensor]) -> None:
        targets = self.local_state()
        with torch.no_grad():
            for name, t in loaded.items():
                targets[name].copy_(t)

    def load_dcp(self, d: Path) -> None:
        state = self.dcp_state()
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(d)))
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def load_memory(self) -> None:
        restored = self.memory.resume(self.model, self.opt, self.sched).restored
        if restored is None or restored.source != "memory":
            raise RuntimeError(f"the memory tier did not restore: {restored}")

    def close(self) -> None:
        self.saver.wait()
        self.memory.close(finished=True)
        self.stager.close()


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
    parser.add_argument("--memory-dir", type=Path, default=Path("/dev/shm"),
                        help="tmpfs directory for the memory tier (default /dev/shm)")
    parser.add_argument("--layers", type=int, default=6, help="model depth (6 layers: 1.71 GB with AdamW state)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the project's measured costs here")
    parser.add_argument("--warm", action="store_true", help="restore from the page cache (no cache drop)")
    parser.add_argument("--tp", type=int, choices=(1, 2), default=1,
                        help="2: the sync save at tensor parallelism 2 vs dd (bench/checkpoint_shapes.py)")
    args = parser.parse_args()
    if args.tp == 2:
        shapes = [sys.executable, str(Path(__file__).with_name("checkpoint_shapes.py")), "--states", "tp2", "--reps",
                  str(args.reps), "--hidden", str(args.hidden), "--vocab", str(args.vocab)]
        sys.exit(subprocess.run(shapes + (["--dir", str(args.dir)] if args.dir else [])).returncode)
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.memory_dir))
    torch.set_num_threads(os.cpu_count() or 1)

    comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", 0))
    model, opt, sched = payload(comm, args.layers, args.hidden, args.vocab)
    cfg = CheckpointConfig(memory=MemoryTierConfig(every_steps=1, dir=str(shm)))
    m = Methods(comm, model, opt, sched, cfg, base)
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

    def background(name: str, start_save: Callable[[], tuple[float, Callable[[], bool]]]) -> None:
        """One save to completion (blocking, durable), then one under the matmul (slowdown, lost)."""
        start = time.perf_counter()
        blocking, done = start_save()
        while not done():
            time.sleep(0.002)
        record(f"durable {name}", time.perf_counter() - start)
        record(f"blocking {name}", blocking)
        idle = mm.idle_rate()
        blocking, done = start_save()
        background_start = time.perf_counter()
        rate = mm.rate(done)
        record(f"slowdown {name}", rate / idle)
        # Compute the training thread lost to this save: blocked, then slowed down.
        # A matmul rate above its idle one is the machine's noise, not a save that sped training up.
        record(f"lost {name}", blocking + max(0.0, 1 - rate / idle) * (time.perf_counter() - background_start))

    def memory_rep() -> None:
        start = time.perf_counter()
        blocking, _ = m.async_memory()
        m.memory._fence()  # an optimizer step issued at once waits here for the copy
        record("copy memory", time.perf_counter() - start)
        m.memory.wait()
        record("durable memory", time.perf_counter() - start)
        record("blocking memory", blocking)
        background("memory", m.async_memory)
        m.memory.wait()

    print(f"payload: {gb:.3f} GB (FSDP2 model on 1 rank + AdamW state, {len(snap.model) + len(snap.optimizer)} "
          f"tensors), {args.reps} reps, dir {base}, memory tier {shm}", flush=True)
    for name, start_async in asyncs.items():  # warm-up: the first saves allocate the stagers' buffers
        for i in range(2):
            blocking, done = start_async(base / f"warm-{name}-{i}")
            if i == 0:
                record(f"first blocking {name}", blocking)
            mm.rate(done)
            shutil.rmtree(base / f"warm-{name}-{i}")
    cold = True
    for rep in range(args.reps):
        order = list(ROTATION)[rep % len(ROTATION):] + list(ROTATION)[: rep % len(ROTATION)]
        for name in order:
            if name.startswith("dd"):
                record(name, dd(base, size, direct=name == "dd direct"))
            elif name == "memory":
                memory_rep()
            else:
                d = base / f"{name}-{rep}"
                start = time.perf_counter()
                saves[name](d)
                record(f"save {name}", time.perf_counter() - start)
                if name in asyncs:
                    background(name, lambda n=name: asyncs[n](base / f"{n}-async-{rep}"))
                    shutil.rmtree(base / f"{name}-async-{rep}")
        snap_s, plan_s = m.blocking_parts()
        record("snapshot", snap_s)
        record("plan", plan_s)
        for name in [n for n in order if not n.startswith("dd")]:
            start = time.perf_counter()
            if name == "memory":
                m.load_memory()
            else:
                cold = not args.warm and drop_caches() and cold
                start = time.perf_counter()
                loads[name](base / f"{name}-{rep}")
                shutil.rmtree(base / f"{name}-{rep}")
            record(f"load {name}", time.perf_counter() - start)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in t.items()), flush=True)
    m.close()
    comm.close()
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
    kind = "cold" if cold else "warm"
    report(t, size, kind)
    if args.json:
        write_costs(args.json, t, size, kind)


def medians(t: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in t.items()}


def write_costs(path: Path, t: dict[str, list[float]], size: int, kind: str) -> None:
    """The project's costs, in the keys `resilient_slurm.simulate --from-bench` reads (docstring)."""
    med = medians(t)
    dd_direct = dd_bytes(size, True) / med["dd direct"] / 1e9
    costs = {
        "source": "bench/checkpoint.py",
        "bytes": size,
        "save_s": round(med["save project"], 4),
        "durable_s": round(med["durable project"], 4),
        "blocking_s": round(med["blocking project"], 4),
        "lost_s": round(med["lost project"], 4),
        "load_s": round(med["load project"], 4),
        "load_cache": kind,
        "dd_direct_gb_s": round(dd_direct, 4),
        "sync_vs_dd_direct": round(size / med["save project"] / 1e9 / dd_direct, 4),
        "memory_blocking_s": round(med["blocking memory"], 4),
        "memory_copy_s": round(med["copy memory"], 4),
        "memory_save_s": round(med["durable memory"], 4),
        "memory_lost_s": round(med["lost memory"], 4),
        "memory_load_s": round(med["load memory"], 4),
        "reps": len(t["save project"]),
        "note": "one process on this machine's disk: holds for a rank whose shard is this size on this storage",
    }
    path.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"costs for the simulator: {path}")


def report(t: dict[str, list[float]], size: int, kind: str) -> None:
    med = medians(t)
    gb = size / 1e9
    n = len(t["dd"])
    dd_gbs = dd_bytes(size, False) / med["dd"] / 1e9
    dd_direct = dd_bytes(size, True) / med["dd direct"] / 1e9
    print()
    print(f"disk, same run, same rotation (median of {n}): dd bs=1M conv=fdatasync {dd_gbs:.2f} GB/s; "
          f"dd bs=64M oflag=direct {dd_direct:.2f} GB/s")
    print(f"| method | sync save s | GB/s | x dd direct | x save_file | x DCP t=1 | async blocking s | "
          f"async durable s | restore ({kind}) s | GB/s | x DCP reader | x torch.load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in SAVES:
        s, lo = med[f"save {name}"], med[f"load {name}"]
        blocking = f"{med[f'blocking {name}']:.3f}" if name in ASYNC else "-"
        durable = f"{med[f'durable {name}']:.2f}" if name in ASYNC else "-"
        print(f"| {name} | {s:.2f} | {gb / s:.2f} | {gb / s / dd_direct:.2f} | {med['save safetensors'] / s:.2f} | "
              f"{med['save DCP'] / s:.2f} | {blocking} | {durable} | {lo:.2f} | {gb / lo:.2f} | "
              f"{med['load DCP'] / lo:.2f} | {med['load torch.save'] / lo:.2f} |")
    lo = med["load memory"]
    print(f"| memory tier | - | - | - | - | - | {med['blocking memory']:.3f} | {med['durable memory']:.2f} | "
          f"{lo:.2f} (tmpfs) | {gb / lo:.2f} | {med['load DCP'] / lo:.2f} | {med['load torch.save'] / lo:.2f} |")
    print("DCP: FileSystemWriter(thread_count=1) / FileSystemReader; async_save THREAD with a reused "
          "DefaultStager(StagingOptions(False, False, False, False)).")
    print()
    copy = med["blocking project"] - med["snapshot"] - med["plan"]
    print("| blocking, same state (medians) | s | x async disk save |")
    print("|---|---|---|")
    for label, key in (("sync save (the whole save)", "save project"), ("async disk save", "blocking project"),
                       ("memory tier: the save call", "blocking memory"),
                       ("memory tier: until the bytes are out of the tensors", "copy memory")):
        print(f"| {label} | {med[key]:.3f} | {med[key] / med['blocking project']:.2f} |")
    print(f"async disk save's blocking, in parts: snapshot {med['snapshot']:.3f} s + plan (names, headers, JSON) "
          f"{med['plan']:.3f} s + copy into the staging buffers {copy:.3f} s")
    print(f"memory tier: committed in memory {med['durable memory']:.2f} s after the call; restore from memory "
          f"{med['load memory']:.2f} s")
    print(f"async, first save of a run (allocates the stager's buffers): blocking project "
          f"{t['first blocking project'][0]:.2f} s, DCP {t['first blocking DCP'][0]:.2f} s")
    print(f"training-thread matmul rate during the background part of a save, vs idle: project "
          f"{med['slowdown project']:.2f}, DCP {med['slowdown DCP']:.2f}, memory tier {med['slowdown memory']:.2f}; "
          f"training time lost per save (blocked + slowed): project {med['lost project']:.2f} s, DCP "
          f"{med['lost DCP']:.2f} s, memory tier {med['lost memory']:.2f} s")
    print()
    p = "project"
    checks = [
        ("sync save >= 0.85x dd oflag=direct (same bytes, same rotation)", gb / med[f"save {p}"] / dd_direct, 0.85,
         True),
        ("sync save >= 1.3x safetensors.save_file", med["save safetensors"] / med[f"save {p}"], 1.3, True),
        ("sync save >= 2.5x DCP FileSystemWriter t=1", med["save DCP"] / med[f"save {p}"], 2.5, True),
        ("async blocking <= 1/10 of the project's sync save", med[f"blocking {p}"] / med[f"save {p}"], 0.1, False),
        ("async blocking <= 1/10 of DCP's sync save", med[f"blocking {p}"] / med["save DCP"], 0.1, False),
        ("async blocking <= DCP async_save blocking (warm stager)", med[f"blocking {p}"] / med["blocking DCP"],
         1.0, False),
        ("time until durable <= 1.2x the sync save", med[f"durable {p}"] / med[f"save {p}"], 1.2, False),
        ("memory tier blocking <= 1/3 of the async disk save's", med["blocking memory"] / med[f"blocking {p}"],
         1 / 3, False),
        (f"{kind} restore >= 1.2x DCP FileSystemReader", med["load DCP"] / med[f"load {p}"], 1.2, True),
        (f"{kind} restore >= 3x eager torch.load", med["load torch.save"] / med[f"load {p}"], 3.0, True),
        ("training slowed by a background save no more than by DCP's (rate while saving)",
         med[f"slowdown {p}"] / med["slowdown DCP"], 1.0, True),
        ("training time lost per async save no more than with DCP's", med[f"lost {p}"] / med["lost DCP"], 1.0, False),
    ]
    for label, value, limit, at_least in checks:
        ok = value >= limit if at_least else value <= limit
        print(f"{'met    ' if ok else 'NOT met'}  {label}: {value:.3f} ({'>=' if at_least else '<='} {limit:.3f})")


if __name__ == "__main__":
    main()
