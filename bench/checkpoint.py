"""Checkpoint save and restore speed: the project's checkpoint vs torch.save/torch.load and
safetensors save_file/load_file, next to the disk's own sequential write speed, in one run.

    python bench/checkpoint.py [--dir DIR] [--layers 8] [--reps 3]

The payload is a Llama-shaped fp32 model plus its real AdamW state after one step (>= 1 GB).
Every save includes fsync of its files; every restore ends with the state in the training objects
(model parameters, optimizer state), the way a resume needs it. "cold" restores run after
dropping the page cache (needs root; otherwise the table says "warm"). Methods run in a rotated
order each rep, and the table shows medians, because this machine's disk swings 2-5x between reps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.load import load_into  # noqa: E402
from resilient_slurm.checkpoint.save import save  # noqa: E402
from resilient_slurm.checkpoint.state import (  # noqa: E402
    Snapshot, capture_rng, model_tensors, optimizer_meta, optimizer_tensors, param_names,
)
from resilient_slurm.checkpoint.verify import verify  # noqa: E402
from resilient_slurm.config import CheckpointConfig, ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.workload.model import build_model  # noqa: E402


def payload(layers: int):
    cfg = ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_layers=layers, num_heads=16,
                      num_kv_heads=16, max_seq_len=64)
    model = build_model(cfg, seed=0)
    opt = build_optimizer(model, OptimConfig())
    sched = build_scheduler(opt, OptimConfig(), 100)
    model(torch.randint(0, cfg.vocab_size, (1, 16))).float().mean().backward()
    opt.step()
    sched.step()
    for p in model.parameters():
        p.grad = None
    return model, opt, sched


def nbytes(model, opt) -> int:
    names = param_names(model)
    tensors = list(model_tensors(model).values()) + list(optimizer_tensors(opt, names).values())
    return sum(t.numel() * t.element_size() for t in tensors)


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


class Methods:
    """Each method saves the same state into a fresh directory and restores it into the objects."""

    def __init__(self, model, opt, sched, cfg: CheckpointConfig) -> None:
        self.model, self.opt, self.sched, self.cfg = model, opt, sched, cfg
        self.names = param_names(model)
        self.comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", 0))

    # --- the project
    def save_project(self, d: Path) -> None:
        snap = Snapshot(model_tensors(self.model), optimizer_tensors(self.opt, self.names), capture_rng(),
                        {"train_state.json": {"step": 1}, "scheduler.json": self.sched.state_dict(),
                         "optimizer.json": optimizer_meta(self.opt, self.names)})
        save(d, 1, snap, self.comm, self.cfg.max_shard_bytes, self.cfg.io_threads)

    def load_project(self, d: Path) -> None:
        path = d / "step_00000001"
        verdict = verify(path, checksums=False)
        load_into(path, verdict.manifest, 0, self.model, self.opt, self.sched, self.cfg.io_threads)

    # --- torch.save / torch.load
    def save_torch(self, d: Path) -> None:
        d.mkdir(parents=True)
        with open(d / "ckpt.pt", "wb") as f:
            torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    def load_torch(self, d: Path) -> None:
        state = torch.load(d / "ckpt.pt", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])

    # --- safetensors save_file / load_file (optimizer state flattened by name, groups as metadata)
    def save_safetensors(self, d: Path) -> None:
        d.mkdir(parents=True)
        save_file(model_tensors(self.model), str(d / "model.safetensors"))
        optim = optimizer_tensors(self.opt, self.names)
        for key in ("exp_avg", "exp_avg_sq"):
            part = {n: t for n, t in optim.items() if n.endswith(key) or (key == "exp_avg" and n.endswith(".step"))}
            save_file(part, str(d / f"optim-{key}.safetensors"))
        for f in d.iterdir():
            fsync_path(f)

    def load_safetensors(self, d: Path) -> None:
        self.model.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
        flat = {**load_file(str(d / "optim-exp_avg.safetensors")), **load_file(str(d / "optim-exp_avg_sq.safetensors"))}
        by_name = {n: p for p, n in self.names.items()}
        for name, t in flat.items():
            pname, key = name.rsplit(".", 1)
            self.opt.state[by_name[pname]][key].copy_(t)


def dd_write(d: Path, size: int) -> float:
    target = d / "dd.bin"
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size >> 20}", "conv=fdatasync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--layers", type=int, default=8, help="model depth (8 layers: 2.0 GB with AdamW state)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    torch.set_num_threads(os.cpu_count() or 1)

    model, opt, sched = payload(args.layers)
    size = nbytes(model, opt)
    m = Methods(model, opt, sched, CheckpointConfig())
    methods = {"project": (m.save_project, m.load_project), "torch.save": (m.save_torch, m.load_torch),
               "safetensors": (m.save_safetensors, m.load_safetensors)}
    saves: dict[str, list[float]] = {k: [] for k in methods}
    loads: dict[str, list[float]] = {k: [] for k in methods}
    dd: list[float] = []
    cold = True
    print(f"payload: {size / 1e9:.2f} GB (model + AdamW state), {args.reps} reps, dir {base}", flush=True)
    for rep in range(args.reps):
        order = list(methods)
        order = order[rep % len(order):] + order[: rep % len(order)]
        dd.append(dd_write(base, size))
        for name in order:
            d = base / f"{name}-{rep}"
            start = time.perf_counter()
            methods[name][0](d)
            saves[name].append(time.perf_counter() - start)
        for name in order:
            d = base / f"{name}-{rep}"
            cold = drop_caches() and cold
            start = time.perf_counter()
            methods[name][1](d)
            loads[name].append(time.perf_counter() - start)
            shutil.rmtree(d)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} save {saves[k][-1]:.2f}s load {loads[k][-1]:.2f}s" for k in order),
              flush=True)
    shutil.rmtree(base, ignore_errors=True)

    med = statistics.median
    dd_s = med(dd)
    gb = size / 1e9
    kind = "cold" if cold else "warm"
    print()
    print(f"disk: dd bs=1M conv=fdatasync {gb / dd_s:.2f} GB/s (median of {len(dd)})")
    print(f"| method | save s | save GB/s | x dd | x save_file | x torch.save | restore ({kind}) s | restore GB/s | x torch.load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in methods:
        s, lo = med(saves[name]), med(loads[name])
        print(f"| {name} | {s:.2f} | {gb / s:.2f} | {dd_s / s:.2f} | {med(saves['safetensors']) / s:.2f} | "
              f"{med(saves['torch.save']) / s:.2f} | {lo:.2f} | {gb / lo:.2f} | {med(loads['torch.save']) / lo:.2f} |")
    print()
    ok_save = med(saves["safetensors"]) / med(saves["project"]) >= 1.3 and \
        med(saves["torch.save"]) / med(saves["project"]) >= 2.0
    ok_load = med(loads["torch.save"]) / med(loads["project"]) >= 3.0
    print(f"targets: save >= 1.3x save_file and >= 2x torch.save: {'met' if ok_save else 'NOT met'}; "
          f"{kind} restore >= 3x torch.load: {'met' if ok_load else 'NOT met'}")


if __name__ == "__main__":
    main()
