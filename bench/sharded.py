"""Sharded training state on CPU ranks (FSDP2, gloo): memory per rank, loading pretrained weights,
and a 2-rank sharded save against a 1-rank save of the same state (about 4 minutes on 2 cores).

    python bench/sharded.py [--layers 12] [--hidden 768] [--steps 2] [--seq 256] [--reps 5]
                            [--io-threads 4 1] [--dir DIR]

The model is Llama-shaped (vocab 32000, hidden 768, MLP 2048, 12 query / 4 key-value heads, 12
layers, untied: 124.7M parameters), written by transformers' `save_pretrained` in float32 as
200 MB shards. Three worker processes run the project's own code, one torch thread each: two
ranks of one FSDP2 run (world 2) and one rank alone (world 1).

1. Load. Each rank measures its runtime baseline: VmRSS once torch, the project and the process
   group are up and a first module has been built on the meta device (that imports torch._dynamo,
   once per process), before the model exists. It resets the kernel's high-water mark (writing 5
   to /proc/self/clear_refs), builds the model the way a run does (`trainer.build.build_model`:
   meta device, `fully_shard`, every rank filling its own rows from the files), and reads the
   high-water mark (VmHWM in /proc/self/status). ru_maxrss is not used: a spawned child inherits
   its parent's high-water mark across exec. Bytes read: the rank's `rchar` in /proc/self/io
   (every byte the process read through read/pread) over the build, against the weight files'
   bytes. Then each rank checks its rows against the files.
2. Train. The 2-rank run takes --steps optimizer steps (`trainer.step.StepRunner`, bf16 compute,
   float32 master weights, AdamW) on random tokens, one --seq row per rank; then each rank sums
   the bytes of its local shards (`p.to_local()`, the gradients, AdamW's state) against the
   unsharded total, computed from the global shapes. It saves that state, and the 1-rank worker
   loads it (`checkpoint.load.load_into`, resharding 2 -> 1): from here both hold the same model
   and optimizer values.
3. Save. In each of --reps rounds, in an order rotated every round: the 2-rank save and the 1-rank
   save (`checkpoint.save.save`, files fsynced) at each --io-threads count of writer threads per
   rank, and the disk's own speed on the same bytes: `dd bs=1M conv=fdatasync`, two such dd's at
   once of half the bytes each, and `dd bs=64M oflag=direct` (direct I/O, as the project's writer
   does), each into a fresh directory removed afterwards. Aggregate GB/s is the bytes written over
   the wall time from a barrier to the end of the save (its commit is collective, so the ranks end
   together). Medians; the first round's saves are verified with checksums.

Holds on this machine kind (2 shared cores, one virtio disk whose speed swings 2-5x between runs:
read the ratios, not the absolute numbers). The memory ratios do not depend on the load; the
save's GB/s does. Two ranks on one disk share its bandwidth: what sharding adds there is
parallel streams, not bandwidth (on a cluster each node writes to its own disk or to a parallel
file system).
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.load import load_into  # noqa: E402
from resilient_slurm.checkpoint.save import save  # noqa: E402
from resilient_slurm.checkpoint.train_state import TrainState  # noqa: E402
from resilient_slurm.checkpoint.state import capture_snapshot, local_rows  # noqa: E402
from resilient_slurm.checkpoint.verify import verify  # noqa: E402
from resilient_slurm.config import Config, ModelConfig  # noqa: E402
from resilient_slurm.trainer import build  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.trainer.step import StepRunner  # noqa: E402
from resilient_slurm.data.batches import Batch  # noqa: E402
from resilient_slurm.model.pretrained import HFWeights, read_model_config  # noqa: E402

MEMORY_TARGET = 0.55
"""Parameter + gradient + optimizer bytes per rank, as a fraction of the unsharded total."""
LOAD_TARGET = 0.6
"""Peak RSS while loading pretrained weights, above the baseline, as a fraction of the fp32 model."""
MB = 10**6


def proc_status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def reset_peak_rss() -> None:
    """Restart VmHWM from the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


class Rank:
    """One worker: a rank of a run of `world` ranks, driven by commands from the parent."""

    def __init__(self, rank: int, world: int, port: int, model_dir: str, options: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.rank, self.world, self.options = rank, world, options
        self.comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port))
        model = ModelConfig(**read_model_config(model_dir), pretrained=model_dir, dtype="bfloat16")
        self.cfg = Config(model=model)
        self.model: Any = None

    def load(self) -> dict[str, Any]:
        weights = HFWeights(self.cfg.model.pretrained or "")
        before_meta = proc_status("VmRSS")
        # The first module built on the meta device imports torch._dynamo (~75 MB, ~2 s here),
        # once per process: the runtime's cost, not the model's, so it goes into the baseline.
        with torch.device("meta"):
            torch.nn.Embedding(2, 2)
        baseline, startup_peak = proc_status("VmRSS"), proc_status("VmHWM")
        self.comm.barrier()
        reset_peak_rss()
        read_before, start = bytes_read(), time.perf_counter()
        self.model = build.build_model(self.cfg, self.comm)
        seconds, read = time.perf_counter() - start, bytes_read() - read_before
        peak = proc_status("VmHWM")
        full = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.optimizer = build_optimizer(self.model, self.cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, 100)
        self.trainer = StepRunner(self.model, self.optimizer, self.scheduler, self.comm, self.cfg.optim.grad_clip)
        return {"before_meta": before_meta, "baseline": baseline, "startup_peak": startup_peak, "peak": peak,
                "read": read,
                "files": weights.file_bytes, "full_model": full, "seconds": seconds,
                "rows_match": self._rows_match(weights)}

    def _rows_match(self, weights: HFWeights) -> bool:
        for name, p in self.model.named_parameters():
            start, stop = local_rows(p)
            local = p.to_local()
            expected = torch.empty(local.shape, dtype=local.dtype)
            weights.read_rows(name, start, stop, expected)
            if not torch.equal(local, expected):
                return False
        return True

    def train(self) -> dict[str, Any]:
        seq, vocab = self.options["seq"], self.cfg.model.vocab_size
        reset_peak_rss()
        rss_before = proc_status("VmRSS")
        losses = []
        for step in range(self.options["steps"]):
            g = torch.Generator().manual_seed(1000 * step + self.rank)
            tokens = torch.randint(0, vocab, (1, seq + 1), generator=g)
            batch = Batch(tokens[:, :-1], tokens[:, 1:], torch.arange(seq)[None], torch.zeros(1, seq, dtype=torch.long))
            losses.append(self.trainer.step([batch]).loss)
        params = list(self.model.parameters())
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return {
            "losses": losses,
            "params": sum(local_bytes(p) for p in params),
            "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optim": sum(local_bytes(v) for v in state),
            "params_full": sum(p.numel() * p.element_size() for p in params),
            "grads_full": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optim_full": sum(v.numel() * v.element_size() for v in state),
            "train_peak_above": proc_status("VmHWM") - rss_before,
        }

    def save(self, root: str, step: int, io_threads: int) -> dict[str, Any]:
        self.comm.barrier()
        start = time.perf_counter()
        snap = capture_snapshot(self.model, self.optimizer, self.scheduler, TrainState(step=step))
        result = save(Path(root), step, snap, self.comm, self.cfg.checkpoint.max_shard_bytes, io_threads)
        return {"seconds": time.perf_counter() - start, "nbytes": result.nbytes, "path": str(result.path)}

    def adopt(self, path: str) -> dict[str, Any]:
        """Take the state saved by another world size (this rank reads only its rows)."""
        verdict = verify(Path(path))
        if not verdict.ok or verdict.manifest is None:
            raise RuntimeError(f"{path}: {verdict.reason}")
        restored = load_into(Path(path), verdict.manifest, self.rank, self.model, self.optimizer, self.scheduler,
                             self.cfg.checkpoint.io_threads)
        return {"bytes_read": restored.bytes_read, "saved_world_size": restored.saved_world_size}


def worker(rank: int, world: int, port: int, model_dir: str, options: dict[str, Any], commands: Any,
           results: Any) -> None:
    try:
        me = Rank(rank, world, port, model_dir, options)
    except Exception:  # noqa: BLE001 - the parent must hear of it, or it waits forever
        results.put((world, rank, "start", None, traceback.format_exc()))
        return
    results.put((world, rank, "start", {}, None))
    while True:
        command, args = commands.get()
        if command == "quit":
            me.comm.close()
            return
        try:
            results.put((world, rank, command, getattr(me, command)(*args), None))
        except Exception:  # noqa: BLE001 - reported to the parent, which stops the benchmark
            results.put((world, rank, command, None, traceback.format_exc()))


class Group:
    """The worker processes of one run (one world size)."""

    def __init__(self, ctx: Any, world: int, model_dir: str, options: dict[str, Any], results: Any) -> None:
        self.world = world
        self.results = results
        self.commands = [ctx.Queue() for _ in range(world)]
        port = free_port()
        self.procs = [ctx.Process(target=worker, args=(r, world, port, model_dir, options, self.commands[r], results))
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def send(self, command: str, *args: Any) -> None:
        for q in self.commands:
            q.put((command, args))

    def close(self) -> None:
        self.send("quit")
        for p in self.procs:
            p.join(timeout=60)


class Driver:
    def __init__(self, groups: list[Group], results: Any) -> None:
        self.groups = {g.world: g for g in groups}
        self.results = results
        self.pending: dict[tuple[int, int, str], Any] = {}

    def wait(self, world: int, command: str) -> list[dict[str, Any]]:
        """Every rank's answer to `command` of group `world`, in rank order."""
        out: dict[int, dict[str, Any]] = {}
        while len(out) < world:
            key = next((k for k in self.pending if k[0] == world and k[2] == command), None)
            if key is not None:
                out[key[1]] = self.pending.pop(key)
                continue
            try:
                w, rank, cmd, value, error = self.results.get(timeout=600)
            except queue.Empty:
                raise SystemExit(f"sharded: no answer to {command} from the {world}-rank group in 10 minutes") from None
            if error:
                raise SystemExit(f"sharded: rank {rank} of {w} failed in {cmd}:\n{error}")
            self.pending[(w, rank, cmd)] = value
        return [out[r] for r in range(world)]

    def run(self, world: int, command: str, *args: Any) -> list[dict[str, Any]]:
        self.groups[world].send(command, *args)
        return self.wait(world, command)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_model(directory: str, layers: int, hidden: int) -> int:
    """The pretrained directory, as transformers writes it: float32, 200 MB shards. Returns the
    parameter count."""
    import transformers  # the parent's alone: the ranks' baseline RSS stays the runtime's own

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 256 * 256,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 192,
        max_position_embeddings=2048, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).float()
    model.save_pretrained(directory, max_shard_size="200MB")
    return sum(p.numel() for p in model.parameters())


DD = {
    "dd": (["bs=1M", "conv=fdatasync"], 1 << 20, 1),
    "dd x2": (["bs=1M", "conv=fdatasync"], 1 << 20, 2),
    "dd direct": (["bs=64M", "oflag=direct"], 1 << 26, 1),
}
"""The disk's own speed on the same bytes: dd's options, its block size, how many run at once
(each writing its share)."""


def dd_bytes(kind: str, nbytes: int) -> int:
    """What a `DD` kind writes for `nbytes` (whole blocks)."""
    _, block, streams = DD[kind]
    return streams * (nbytes // streams // block * block)


def dd(kind: str, d: Path, nbytes: int) -> None:
    options, block, streams = DD[kind]
    procs = [subprocess.Popen(["dd", "if=/dev/zero", f"of={d / f'dd{i}.bin'}", *options,
                               f"count={nbytes // streams // block}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(streams)]
    if any(p.wait() for p in procs):
        raise SystemExit(f"sharded: {kind} failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768, help="a multiple of 192 (64-wide heads, 3 per kv head)")
    parser.add_argument("--steps", type=int, default=2, help="training steps before measuring")
    parser.add_argument("--seq", type=int, default=256, help="tokens per rank per step")
    parser.add_argument("--reps", type=int, default=5, help="rounds of the save comparison")
    parser.add_argument("--io-threads", type=int, nargs="+", default=[4, 1],
                        help="writer threads per rank to compare (checkpoint.io_threads; its default is 4)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    if args.hidden % 192:
        parser.error("--hidden must be a multiple of 192")
    base = Path(tempfile.mkdtemp(prefix="bench-sharded-", dir=args.dir))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    groups: list[Group] = []
    try:
        model_dir = str(base / "pretrained")
        start = time.perf_counter()
        n_params = write_model(model_dir, args.layers, args.hidden)
        print(f"pretrained: {n_params / 1e6:.1f}M parameters, float32, written by transformers in "
              f"{time.perf_counter() - start:.0f} s: {sorted(os.listdir(model_dir))}", flush=True)
        options = {"seq": args.seq, "steps": args.steps}
        groups = [Group(ctx, 2, model_dir, options, results), Group(ctx, 1, model_dir, options, results)]
        driver = Driver(groups, results)
        for g in groups:
            driver.wait(g.world, "start")
        loads = {w: driver.run(w, "load") for w in (2, 1)}
        print("loaded", flush=True)
        trained = driver.run(2, "train")
        print(f"trained {args.steps} steps on 2 ranks: losses {trained[0]['losses']}", flush=True)
        seed_save = driver.run(2, "save", str(base / "seed"), args.steps, args.io_threads[0])[0]
        adopted = driver.run(1, "adopt", seed_save["path"])[0]
        shutil.rmtree(base / "seed")
        size = seed_save["nbytes"]

        ranks = {f"{w} rank{'s' if w > 1 else ''} x {t} thread{'s' if t > 1 else ''}": (w, t)
                 for t in args.io_threads for w in (2, 1)}
        saves: dict[str, list[float]] = {k: [] for k in [*ranks, *DD]}
        nbytes = {kind: dd_bytes(kind, size) for kind in DD}
        for rep in range(args.reps):
            order = list(saves)[rep % len(saves):] + list(saves)[:rep % len(saves)]
            for what in order:
                d = base / f"{rep}-{what.replace(' ', '')}"
                d.mkdir()
                start = time.perf_counter()
                if what in DD:
                    dd(what, d, size)
                    saves[what].append(time.perf_counter() - start)
                else:
                    world, threads = ranks[what]
                    answers = driver.run(world, "save", str(d), args.steps, threads)
                    saves[what].append(max(a["seconds"] for a in answers))
                    nbytes[what] = answers[0]["nbytes"]
                    if rep == 0:
                        verdict = verify(Path(answers[0]["path"]))
                        if not verdict.ok:
                            raise SystemExit(f"sharded: the {what} save does not verify: {verdict.reason}")
                shutil.rmtree(d)
            print(f"round {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in saves.items() if v), flush=True)
        report(args, loads, trained, adopted, saves, nbytes, ranks, n_params)
    finally:
        for g in groups:
            g.close()
        shutil.rmtree(base, ignore_errors=True)


def report(args: argparse.Namespace, loads: dict[int, list[dict[str, Any]]], trained: list[dict[str, Any]],
           adopted: dict[str, Any], saves: dict[str, list[float]], nbytes: dict[str, int],
           ranks: dict[str, tuple[int, int]], n_params: int) -> None:
    print()
    print(f"Model: {n_params / 1e6:.1f}M parameters ({args.layers} layers, hidden {args.hidden}, vocab 32000), "
          f"FSDP2, bf16 compute, float32 master weights, AdamW; gloo on CPU, one torch thread per rank")
    print()
    print(f"Memory per rank after {args.steps} training steps (local shards vs the unsharded total, MB)")
    print("| world | rank | parameters | gradients | AdamW state | total | unsharded total | ratio | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    memory_ok = True
    for rank, t in enumerate(trained):
        total = t["params"] + t["grads"] + t["optim"]
        full = t["params_full"] + t["grads_full"] + t["optim_full"]
        ok = total / full <= MEMORY_TARGET
        memory_ok &= ok
        print(f"| 2 | {rank} | {t['params'] / MB:.1f} | {t['grads'] / MB:.1f} | {t['optim'] / MB:.1f} | "
              f"{total / MB:.1f} | {full / MB:.1f} | {total / full:.3f} | "
              f"<= {MEMORY_TARGET} {'met' if ok else 'NOT met'} |")
    print("Peak RSS over the training steps, above the RSS before them (the gradients and AdamW state the first "
          "step creates, activations, unsharded layers, gloo and foreach buffers; no target): " +
          ", ".join(f"rank {r} {t['train_peak_above'] / MB:.0f} MB" for r, t in enumerate(trained)))
    print()
    print("Loading pretrained weights (float32 files): build on meta, shard, each rank fills its rows "
          "(trainer.build.build_model); RSS from /proc/self/status, bytes read from /proc/self/io rchar")
    print("| world | rank | baseline RSS | peak RSS | peak - baseline | fp32 model | (peak - baseline) / model | "
          "target | read | files | read / files | rows match files | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    load_ok = True
    for world in (2, 1):
        for rank, r in enumerate(loads[world]):
            above = (r["peak"] - r["baseline"]) / r["full_model"]
            ok = above <= LOAD_TARGET
            if world == 2:
                load_ok &= ok and r["rows_match"]
            target = f"<= {LOAD_TARGET} {'met' if ok else 'NOT met'}" if world == 2 else "(reference)"
            print(f"| {world} | {rank} | {r['baseline'] / MB:.0f} MB | {r['peak'] / MB:.0f} MB | "
                  f"{(r['peak'] - r['baseline']) / MB:.0f} MB | {r['full_model'] / MB:.0f} MB | {above:.3f} | "
                  f"{target} | "
                  f"{r['read'] / MB:.0f} MB | {r['files'] / MB:.0f} MB | {r['read'] / r['files']:.3f} | "
                  f"{r['rows_match']} | {r['seconds']:.1f} |")
    print("Baseline = VmRSS after imports, the process group and a first module on the meta device (which "
          "imports torch._dynamo), before the model. VmRSS before that first meta module / VmHWM until the "
          "baseline: " + ", ".join(f"w{w} r{r} {x['before_meta'] / MB:.0f} / {x['startup_peak'] / MB:.0f} MB"
                                   for w in (2, 1) for r, x in enumerate(loads[w])))
    print(f"The 1-rank worker then took the 2-rank state (load_into, 2 -> 1): {adopted['bytes_read'] / MB:.0f} MB read")
    print()
    med = {k: statistics.median(v) for k, v in saves.items()}
    one_rank = {t: k for k, (w, t) in ranks.items() if w == 1}
    two_ranks = {t: k for k, (w, t) in ranks.items() if w == 2}
    print(f"Sharded save of the same state ({nbytes[one_rank[args.io_threads[0]]] / 1e9:.2f} GB written: weights + "
          f"AdamW state), files fsynced, each into a fresh directory; {args.reps} rounds, rotated order, medians "
          f"(min-max)")
    print("| what | s | GB/s | x the 1-rank save, same threads | x dd direct |")
    print("|---|---|---|---|---|")
    for what, times in saves.items():
        vs_one = f"{med[one_rank[ranks[what][1]]] / med[what]:.2f}" if what in ranks else ""
        print(f"| {what} | {med[what]:.2f} ({min(times):.2f}-{max(times):.2f}) | "
              f"{nbytes[what] / 1e9 / med[what]:.2f} | "
              f"{vs_one} | {med['dd direct'] / med[what] * nbytes[what] / nbytes['dd direct']:.2f} |")
    print("Files written: " + ", ".join(f"{k} {nbytes[k]:,} B" for k in ranks) +
          " (the same tensors; headers and per-rank RNG files differ). dd: if=/dev/zero bs=1M conv=fdatasync; "
          "dd x2: two at once, half the bytes each; dd direct: bs=64M oflag=direct.")
    print()
    print(f"{'met    ' if memory_ok else 'NOT met'}  parameter + gradient + AdamW bytes per rank <= {MEMORY_TARGET} "
          f"of the unsharded total (2 ranks)")
    print(f"{'met    ' if load_ok else 'NOT met'}  peak RSS while loading <= baseline + {LOAD_TARGET} x the fp32 "
          "model, rows equal to the files (2 ranks)")
    print("info     2-rank save / 1-rank save aggregate GB/s: " +
          ", ".join(f"{med[one_rank[t]] / med[two_ranks[t]]:.2f} at {t} thread(s) per rank" for t in args.io_threads) +
          "; bytes read per rank while loading / file bytes: " + ", ".join(f"{r['read'] / r['files']:.3f}"
                                                                        for r in loads[2]))
    if not math.isfinite(sum(trained[0]["losses"])):
        print("NOT met  the training losses are finite")


if __name__ == "__main__":
    main()
