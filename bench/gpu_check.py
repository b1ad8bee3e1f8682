"""One GPU, the project's own training path, checked in one table (issue 11, item 10; ~2-3 minutes).

    python bench/gpu_check.py [--steps 8] [--micro 2] [--seq 2048] [--resume-steps 3] [--dir DIR] [--no-compile]

Run it from the repository root on a machine with one NVIDIA GPU, a CUDA build of torch and the
project's dependencies (`pip install -e .`). It prints one table (PASS / FAIL / INFO with the values)
and exits 0 when every check passed, 1 when one failed, 2 (one line, nothing run) without CUDA.

What it runs, all through the project's code on one rank:
- the deterministic mode the job switches on (`train.deterministic`, runtime/rank.py): one cuBLAS
  matrix product with `torch.use_deterministic_algorithms(True)`, in a child process with the
  environment as it was given; torch refuses cuBLAS in that mode unless CUBLAS_WORKSPACE_CONFIG is
  set. This process sets CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless given) so the other checks run;
- real steps: `Comm(backend="nccl")`, `fsdp.build_model` (FSDP2 over a one-GPU mesh, bf16
  compute, float32 master weights and reduction), `fill_random`, AdamW and `trainer.step.StepRunner`,
  on a Llama-3.2-1B-shaped model (vocab 128256, hidden 2048, MLP 8192, 16 layers, 32 query / 8
  key-value heads, tied embeddings: 1.24B parameters). Each step is --accumulation micro-batches of
  --micro rows of --seq tokens, two documents packed per row (the block-causal mask the training
  path uses), the same batches every step, so the loss must fall;
- tokens/s over --steps steps after two warm-up steps (wall clock between two
  `torch.cuda.synchronize()`), with the deterministic kernels the job uses and without them, and MFU:
  model FLOPs per token = 6 x (parameters in matrix products: the layers' projections and lm_head;
  not the embedding lookup or the norms) + 12 x layers x heads x head_dim x seq (attention scores
  and their weighted sum, forward and backward, PaLM's convention: the causal mask's skipped half is
  counted too), times tokens/s, over the GPU's dense bf16 peak, looked up by its name
  (`PEAK_BF16_TFLOPS`; an unknown GPU gets no MFU);
- NVML while training, against the real driver: `monitor.gpu_sampler.GpuSampler` (utilization,
  memory, temperature, uncorrectable ECC) sampled in the timed window, and `health.nvml_checks`
  (`probe_gpus` + `check_gpus`: ECC, retired pages, row remapping, recovery action, temperature);
- an exact resume with two async saves from GPU memory: train k steps; `checkpoint.async_save.AsyncSaver`
  saves the state from GPU memory through its pinned staging buffers (the first save allocates
  them) while the next k steps train; a second save of the same layout reuses the buffers. A fresh
  model with other weights and another CUDA RNG state restores step k (`checkpoint.load.load_into`)
  and trains the same k steps: weights and losses must be bit-identical to the uninterrupted run,
  the CUDA RNG state equal to the saved one and its next draw equal. The model has no dropout, so
  training never draws from the CUDA RNG; it is seeded and advanced beforehand so the saved state
  is not the default one.
- compiled blocks (`model.compile=true`: each decoder layer through torch.compile, inductor): the
  same timed steps with a compiled model, its first-step loss equal to the eager one's within bf16
  tolerance, the step time beside the eager one (the compilation's first step reported apart);
- the N-D layouts on every visible GPU (2 or more, NCCL, one process per GPU): FSDP2 over all, FSDP2
  x tensor parallelism 2 and HSDP 2 x the rest, each three steps of the same batches from the same
  weights; each layout's losses equal the single-GPU run's within bf16 tolerance (`LAYOUT_RTOL`).
  With one GPU the row says so.
Time to durable is from the call until the commit (manifest written, directory renamed); it holds
for the disk the checkpoint directory (--dir) is on.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.config import CheckpointConfig, Config, ModelConfig, OptimConfig  # noqa: E402
from resilient_slurm.model.decoder import head_dim  # noqa: E402

NO_GPU_EXIT = 2
LLAMA_1B = ModelConfig(
    name="llama-3.2-1b-shaped", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
    num_heads=32, num_kv_heads=8, max_seq_len=8192, rope_theta=500000.0, tie_embeddings=True, dtype="bfloat16",
)
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)
"""Dense bf16 tensor-core peak by a substring of the device name, first match wins (the PCIe and
NVL H100 before the SXM one): NVIDIA's data sheets, without sparsity."""
MFU_FLOOR = 0.10
"""Below this the GPU is barely doing the work (a CPU fallback, a sync every kernel): a failure."""
UTIL_FLOOR_PCT = 50.0
"""DESIGN.md section 3: a training GPU below 50% utilization is abnormal."""
MAX_TEMP_C = 85.0
LAYOUT_RTOL = 2e-2
"""bf16 compute: layouts sum the same products in other orders (over ranks, TP shards), so their
losses agree to bf16's few significant digits, not to float32's."""


@dataclass
class Check:
    name: str
    ok: bool | None
    """None: a value reported, nothing judged."""
    value: str


def peak_bf16_flops(device_name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that enter a matrix product per token: each layer's q, k, v, o, gate, up and down
    projections and lm_head (tied or not, it is one product); not the embedding lookup or norms."""
    hd = head_dim(cfg)
    h = cfg.hidden_size
    attention = h * cfg.num_heads * hd * 2 + h * cfg.num_kv_heads * hd * 2
    mlp = 3 * h * cfg.intermediate_size
    return cfg.num_layers * (attention + mlp) + cfg.vocab_size * h


def flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Training FLOPs per token (forward + backward): 6 per matmul weight, plus attention's
    12 x layers x heads x head_dim x seq."""
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.num_layers * cfg.num_heads * head_dim(cfg) * seq


def mfu(tokens_per_s: float, cfg: ModelConfig, seq: int, peak_flops: float) -> float:
    return tokens_per_s * flops_per_token(cfg, seq) / peak_flops


def packed_batches(cfg: ModelConfig, count: int, micro: int, seq: int, seed: int) -> list[Any]:
    """`count` micro-batches of `micro` rows, two documents per row (positions restart, the
    block-causal mask keeps them apart), from a generator of their own: the global RNGs are left
    alone."""
    from resilient_slurm.data.batches import Batch

    g = torch.Generator().manual_seed(seed)
    half = seq // 2
    positions = torch.cat([torch.arange(half), torch.arange(seq - half)]).expand(micro, seq)
    documents = torch.cat([torch.zeros(half, dtype=torch.long), torch.ones(seq - half, dtype=torch.long)])
    out = []
    for _ in range(count):
        tokens = torch.randint(0, cfg.vocab_size, (micro, seq + 1), generator=g)
        labels = tokens[:, 1:].clone()
        labels[:, half - 1] = -100  # the last token of a document does not predict the next one
        out.append(Batch(tokens[:, :-1].contiguous(), labels, positions.contiguous(),
                         documents.expand(micro, seq).contiguous()))
    return out


@dataclass
class Run:
    """One sharded model with its optimizer, on `comm`'s device."""

    comm: Any
    cfg: Config
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    trainer: Any = None
    losses: list[float] = field(default_factory=list)

    @staticmethod
    def build(comm: Any, cfg: Config, seed: int, layout: Any = None) -> Run:
        """On `layout` (config.Layout; None: FSDP2 over every rank)."""
        from resilient_slurm.parallel import fsdp
        from resilient_slurm.parallel.mesh import ParallelMesh
        from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
        from resilient_slurm.trainer.step import StepRunner

        run = Run(comm, cfg)
        mesh = ParallelMesh(layout, comm.device.type, comm.rank) if layout is not None else None
        if mesh is None:
            run.model = fsdp.build_model(cfg.model, comm.mesh, comm.device)
        else:
            run.model = fsdp.build_model(cfg.model, mesh.dp, comm.device, tp=mesh.tp)
        fsdp.fill_random(run.model, cfg.model, seed)
        run.optimizer = build_optimizer(run.model, cfg.optim)
        run.scheduler = build_scheduler(run.optimizer, cfg.optim, cfg.train.max_steps)
        run.trainer = StepRunner(run.model, run.optimizer, run.scheduler, comm, cfg.optim.grad_clip,
                                 counts_data=mesh.position.counts_data if mesh else True,
                                 vocab_parallel=mesh is not None and mesh.tp is not None)
        return run

    def train(self, steps: list[list[Any]]) -> None:
        for micro_batches in steps:
            self.losses.append(self.trainer.step(micro_batches).loss)

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's shards, copied to host memory."""
        return {n: p.to_local().detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}

    def close(self) -> None:
        self.model = self.optimizer = self.scheduler = self.trainer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


CUBLAS_PROBE = ("import torch; torch.use_deterministic_algorithms(True); a = torch.ones(64, 64, device='cuda'); "
                "print((a @ a).sum().item())")


def check_deterministic_cublas(env: dict[str, str]) -> Check:
    """Does a cuBLAS product run in deterministic mode in the environment `env`? In a process of
    its own: torch reads CUBLAS_WORKSPACE_CONFIG when it makes its first cuBLAS workspace."""
    given = env.get("CUBLAS_WORKSPACE_CONFIG")
    done = subprocess.run([sys.executable, "-c", CUBLAS_PROBE], env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    if done.returncode == 0:
        return Check("deterministic mode (train.deterministic) allows cuBLAS", True,
                     f"ran with CUBLAS_WORKSPACE_CONFIG={given!r}")
    error = next((line for line in reversed(done.stderr.splitlines()) if "Error" in line), done.stderr.strip()[-200:])
    return Check("deterministic mode (train.deterministic) allows cuBLAS", False,
                 f"with CUBLAS_WORKSPACE_CONFIG={given!r}: {error[:160]}; runtime/rank.py turns deterministic mode on "
                 "without setting it, so a GPU run with train.deterministic=true would stop at its first matmul")


def check_steps(run: Run, batches: list[Any], accumulation: int, steps: int) -> tuple[list[Check], dict[str, float]]:
    """Warm-up and timed steps, deterministic as the job runs them, then without determinism."""
    from torch.distributed.tensor import DTensor

    device = run.comm.device
    out: list[Check] = []
    compute: list[torch.dtype] = []
    hook = run.model.model.layers["0"].register_forward_hook(lambda _m, _i, o: compute.append(o.dtype))
    step_batches = [batches[i:i + accumulation] for i in range(0, len(batches), accumulation)]
    timing: dict[str, float] = {}
    for deterministic in (True, False):
        torch.use_deterministic_algorithms(deterministic)
        run.train(step_batches[:1] * 2)  # warm-up: kernels chosen, allocator filled
        synchronize(device)
        start = time.perf_counter()
        run.train(step_batches[:1] * steps)
        synchronize(device)
        timing["deterministic" if deterministic else "default"] = time.perf_counter() - start
    hook.remove()
    torch.use_deterministic_algorithms(False)
    params = list(run.model.parameters())
    placed = all(isinstance(p, DTensor) and p.device.type == device.type and p.to_local().dtype == torch.float32
                 for p in params)
    losses = run.losses
    learning = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    out.append(Check("FSDP2 parameters: float32 DTensor shards on the device", placed,
                     f"{len(params)} parameters, mesh {run.comm.mesh.device_type}, backend {run.comm.backend}"))
    out.append(Check("compute dtype (a decoder layer's output)", set(compute) == {torch.bfloat16},
                     ", ".join(sorted({str(d) for d in compute}))))
    out.append(Check("real steps: losses finite and falling on repeated batches", learning,
                     f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}"))
    return out, timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_resume(first: Run, batches: list[Any], k: int, root: Path, io_threads: int,
                 max_shard_bytes: int) -> list[Check]:
    """`first` trains k steps, saves asynchronously, trains k more (the save writing meanwhile) and
    saves again; then a fresh model restores step k and trains the same k steps: everything must
    match bit for bit. `first` is closed on the way (its memory makes room for the second model)."""
    from resilient_slurm.checkpoint import layout
    from resilient_slurm.checkpoint.async_save import AsyncSaver
    from resilient_slurm.checkpoint.group import checkpoint_group
    from resilient_slurm.checkpoint.load import load_into
    from resilient_slurm.checkpoint.state import capture_snapshot
    from resilient_slurm.checkpoint.train_state import TrainState
    from resilient_slurm.checkpoint.verify import verify

    comm, cfg = first.comm, first.cfg
    device = comm.device
    out: list[Check] = []
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(cfg.train.seed)  # seeds the CUDA generators too
        torch.rand(1000, device=device)
        steps = [[b] for b in batches[: 2 * k]]
        done_before = len(first.losses)
        first.train(steps[:k])
        at_k = first.weights()
        saver = AsyncSaver(root, checkpoint_group(comm, 120.0), max_shard_bytes, io_threads)
        done: dict[int, tuple[float, str | None]] = {}

        def on_done(step: int, start: float) -> Callable[[Any, str | None, float], None]:
            return lambda _result, error, _blocking: done.__setitem__(step, (time.perf_counter() - start, error))

        snap = capture_snapshot(first.model, first.optimizer, first.scheduler, TrainState(step=k))
        # Every tensor but AdamW's step counts, which torch keeps on the host whatever the device.
        from_device = all(h.data.device.type == device.type
                          for h in [*snap.model.values(), *snap.optimizer.values()] if h.data.ndim)
        start = time.perf_counter()
        blocking_first = saver.save(k, snap, on_done(k, start))
        saved_rng = rng_state(device).clone()
        expected_draw = torch.rand(16, device=device)
        set_rng_state(device, saved_rng)
        first.train(steps[k:])  # while the save writes
        saver.wait()
        reference, reference_losses = first.weights(), first.losses[done_before + k:]

        snap = capture_snapshot(first.model, first.optimizer, first.scheduler, TrainState(step=2 * k))
        start = time.perf_counter()
        blocking_warm = saver.save(2 * k, snap, on_done(2 * k, start))
        saver.wait()
        # The stager's buffers are what the save staged through (no public view of them).
        buffers = [buf for _, buf in saver.stager._buffers.values()]  # noqa: SLF001
        pinned = bool(buffers) and all(buf.is_pinned() for buf in buffers)
        gb = sum(h.spec.nbytes for h in [*snap.model.values(), *snap.optimizer.values()]) / 1e9
        first.close()
        del snap
        errors = [e for _, e in done.values() if e]
        path, warm_path = root / layout.step_dir_name(k), root / layout.step_dir_name(2 * k)
        # Structure and sizes only: the restore below checks every CRC as it reads.
        verdict = verify(path, checksums=False) if not errors else None
        verified = verdict is not None and verdict.ok and verify(warm_path, checksums=False).ok
        shutil.rmtree(warm_path, ignore_errors=True)
        durable_first, durable_warm = done.get(k, (math.nan, None))[0], done.get(2 * k, (math.nan, None))[0]
        out.append(Check("async save from device memory, committed and verified",
                         not errors and verified and from_device,
                         errors[0] if errors else f"{gb:.2f} GB (weights + AdamW), snapshot on {device.type}"))
        if device.type == "cuda":
            out.append(Check("staging buffers pinned", pinned, f"{len(buffers)} buffers"))
        out.append(Check("async save: first (allocates staging) blocking / durable", None,
                         f"{blocking_first:.2f} s / {durable_first:.2f} s (k steps trained meanwhile)"))
        out.append(Check("async save: warm blocking < durable", blocking_warm < durable_warm,
                         f"{blocking_warm:.3f} s / {durable_warm:.2f} s; {gb / durable_warm:.2f} GB/s to durable"))
        if verdict is None or not verdict.ok or verdict.manifest is None:
            return out

        torch.manual_seed(cfg.train.seed + 1)
        second = Run.build(comm, cfg, cfg.train.seed + 1)
        load_into(path, verdict.manifest, comm.rank, second.model, second.optimizer, second.scheduler, io_threads)
        restored = second.weights()
        out.append(Check("restore: weights at step k bit-identical",
                         all(torch.equal(restored[n], at_k[n]) for n in at_k), f"{len(at_k)} tensors"))
        del restored, at_k
        rng_equal = torch.equal(rng_state(device), saved_rng)
        draw_equal = torch.equal(torch.rand(16, device=device), expected_draw)
        set_rng_state(device, saved_rng)
        out.append(Check(f"{device.type} RNG restored: state and next draw", rng_equal and draw_equal,
                         f"state equal {rng_equal}, draw equal {draw_equal}"))
        second.train(steps[k:])
        resumed = second.weights()
        same = all(torch.equal(resumed[n], reference[n]) for n in reference)
        out.append(Check(f"exact resume: {k} steps after the restore, weights bit-identical", same,
                         f"losses {[f'{x:.6f}' for x in second.losses]}"))
        out.append(Check("exact resume: losses identical", second.losses == reference_losses,
                         f"uninterrupted {[f'{x:.6f}' for x in reference_losses]}"))
        second.close()
    finally:
        torch.use_deterministic_algorithms(False)
    return out


def check_compile(comm: Any, cfg: Config, batches: list[Any], accumulation: int, steps: int,
                  eager_losses: list[float], eager_s: float) -> list[Check]:
    """The timed steps again with every decoder layer compiled: its first loss against the eager
    run's (same weights, same batches), and the step time against `eager_s` (the eager run's
    non-deterministic window of `steps` steps)."""
    compiled = Run.build(comm, replace(cfg, model=replace(cfg.model, compile=True)), cfg.train.seed)
    step_batches = [batches[i:i + accumulation] for i in range(0, len(batches), accumulation)]
    device = comm.device
    try:
        start = time.perf_counter()
        compiled.train(step_batches[:1])
        synchronize(device)
        first_s = time.perf_counter() - start
        compiled.train(step_batches[:1])  # warm-up
        synchronize(device)
        start = time.perf_counter()
        compiled.train(step_batches[:1] * steps)
        synchronize(device)
        seconds = time.perf_counter() - start
        same = math.isclose(compiled.losses[0], eager_losses[0], rel_tol=LAYOUT_RTOL)
    finally:
        compiled.close()
    return [Check("compiled blocks: first loss equals eager's (bf16 tolerance)", same,
                  f"{compiled.losses[0]:.4f} vs {eager_losses[0]:.4f}"),
            Check("compiled blocks: step time", None,
                  f"{seconds / steps:.3f} s compiled vs {eager_s / steps:.3f} s eager ({eager_s / seconds:.2f}x); first "
                  f"step {first_s:.0f} s (compilation)")]


def layouts_for(gpus: int) -> dict[str, Any]:
    """The N-D layouts `gpus` ranks can take: FSDP2 over all, tp 2 x the rest, HSDP 2 x the rest."""
    from resilient_slurm.config import Layout

    if gpus < 2:
        return {}
    out = {f"dp {gpus}": Layout(1, gpus, 1, 1), f"dp {gpus // 2} x tp 2": Layout(1, gpus // 2, 2, 1)}
    if gpus >= 4:
        out[f"hsdp 2 x {gpus // 2}"] = Layout(2, gpus // 2, 1, 1)
    return out


def layout_worker(rank: int, world: int, port: int, backend: str, cfg: Config, batches: list[Any],
                  steps: int, out: str) -> None:
    """One rank of every layout in turn: `steps` steps of the same micro-batches, split by
    data-parallel rank; rank 0 writes each layout's losses to `out` (JSON)."""
    import json

    from resilient_slurm.session.distributed import Comm, RankInfo

    if backend == "nccl":
        torch.cuda.set_device(rank)
    comm = Comm(RankInfo(rank, world, rank, "127.0.0.1", port), backend=backend)
    losses = {}
    try:
        for name, lay in layouts_for(world).items():
            run = Run.build(comm, cfg, cfg.train.seed, lay)
            dp, n = lay.dp_rank(rank), lay.dp
            mine = [b for i, b in enumerate(batches) if i % n == dp]
            run.train([[b.to(comm.device) for b in mine]] * steps)
            losses[name] = run.losses
            run.close()
    finally:
        comm.close()
    if rank == 0:
        Path(out).write_text(json.dumps(losses))


def check_layouts(gpus: int, backend: str, cfg: Config, batches: list[Any], steps: int, single: list[float],
                  root: Path) -> list[Check]:
    """Each layout of `gpus` ranks against `single`, the one-rank losses of the same steps."""
    import json

    import torch.multiprocessing as mp

    if gpus < 2:
        return [Check("N-D layouts (FSDP2 x TP, HSDP)", None, f"{gpus} GPU visible: they need 2 or more")]
    out = root / "layouts.json"
    mp.spawn(layout_worker, args=(gpus, free_port(), backend, cfg, batches, steps, str(out)), nprocs=gpus)
    checks = []
    for name, losses in json.loads(out.read_text()).items():
        same = len(losses) == len(single) and all(math.isclose(a, b, rel_tol=LAYOUT_RTOL) for a, b in zip(losses, single))
        checks.append(Check(f"layout {name}: losses equal one rank's (bf16 tolerance)", same,
                            " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(losses, single))))
    return checks


def check_nvml(sample: dict[str, float], index: int) -> list[Check]:
    from resilient_slurm.health.nvml_checks import check_gpus, probe_gpus

    out = []
    if not sample:
        out.append(Check("NVML sampler during training", False, "no sample (the log line 'GPU metrics off' says why)"))
    else:
        util = sample.get("util_pct", -1.0)
        ecc = sample.get("ecc_uncorrectable")
        ok = (util >= UTIL_FLOOR_PCT and "memory_used_frac" in sample
              and 0 < sample.get("temperature_c", 0) <= MAX_TEMP_C and (ecc is None or ecc == 0))
        out.append(Check("NVML sampler during training (util, memory, temperature, ECC)", ok,
                         f"util {util:.0f}%, memory {sample.get('memory_used_frac', math.nan):.0%}, "
                         f"{sample.get('temperature_c', math.nan):.0f} C, uncorrectable ECC "
                         f"{'not supported' if ecc is None else int(ecc)}"))
    snapshot, why = probe_gpus()
    if snapshot is None:
        out.append(Check("NVML health checks", False, why))
        return out
    findings = check_gpus(snapshot, expected=1, max_temp_c=MAX_TEMP_C)
    gpu = next((g for g in snapshot.gpus if g.index == index), None)
    value = (f"{snapshot.count} GPU(s); GPU {index}: {gpu.temperature_c} C, ECC {gpu.ecc_uncorrected_volatile}, "
             f"remap pending {gpu.remap_pending}" if gpu else f"{snapshot.count} GPU(s)")
    out.append(Check("NVML health checks (health.nvml_checks)", not findings,
                     "; ".join(f.line() for f in findings) if findings else value))
    return out


def print_table(checks: list[Check]) -> None:
    width = max(len(c.name) for c in checks)
    print(f"| {'check':<{width}} | result | value |")
    print(f"|{'-' * (width + 2)}|--------|-------|")
    for c in checks:
        result = "INFO" if c.ok is None else "PASS" if c.ok else "FAIL"
        print(f"| {c.name:<{width}} | {result:<6} | {c.value} |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per throughput window")
    parser.add_argument("--micro", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--resume-steps", type=int, default=3, help="k: steps before and after the saved one")
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="dump every stack and exit after this")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled-blocks check")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False); run it on a "
              "machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return NO_GPU_EXIT
    given_env = dict(os.environ)
    # Deterministic cuBLAS (for the exact resume) needs this before the first cuBLAS call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # A check that hangs is a failed check: NCCL or a driver call can block forever.
    faulthandler.dump_traceback_later(args.timeout_s, exit=True)
    started = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # e.g. why NVML is off
    from resilient_slurm.monitor.gpu_sampler import GpuSampler
    from resilient_slurm.session.distributed import Comm, RankInfo

    props = torch.cuda.get_device_properties(0)
    checks = [Check("device", None, f"{props.name}, {props.total_memory / 2**30:.0f} GiB, capability {props.major}."
                                    f"{props.minor}, torch {torch.__version__}, CUDA {torch.version.cuda}")]
    checks.append(check_deterministic_cublas(given_env))
    comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", free_port()), backend="nccl")
    cfg = Config(model=LLAMA_1B, optim=replace(OptimConfig(), warmup_steps=0, lr=3e-4))
    root = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.dir))
    try:
        run = Run.build(comm, cfg, cfg.train.seed)
        batches = packed_batches(cfg.model, args.accumulation, args.micro, args.seq, seed=1)
        sampler = GpuSampler(comm.local_rank, interval_s=0.2)
        sampler.start()
        step_checks, timing = check_steps(run, batches, args.accumulation, args.steps)
        sample = dict(sampler.latest)
        sampler.stop()
        checks += step_checks
        tokens = args.steps * args.accumulation * args.micro * args.seq
        peak = peak_bf16_flops(props.name)
        for mode, seconds in timing.items():
            rate = tokens / seconds
            if peak is None:
                checks.append(Check(f"tokens/s, MFU ({mode} kernels)", None,
                                    f"{rate:,.0f} tokens/s; no peak for {props.name!r} in PEAK_BF16_TFLOPS"))
                continue
            u = mfu(rate, cfg.model, args.seq, peak)
            checks.append(Check(f"tokens/s, MFU ({mode} kernels; floor {MFU_FLOOR:.0%})", u >= MFU_FLOOR,
                                f"{rate:,.0f} tokens/s, MFU {u:.1%} ({flops_per_token(cfg.model, args.seq) / 1e9:.2f} "
                                f"GFLOP/token, peak {peak / 1e12:.0f} TFLOP/s)"))
        checks.append(Check("peak GPU memory in training", None,
                            f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated, "
                            f"{args.accumulation} x {args.micro} x {args.seq} tokens per step"))
        checks += check_nvml(sample, comm.local_rank)
        if not args.no_compile:
            checks += check_compile(comm, cfg, batches, args.accumulation, args.steps, run.losses, timing["default"])
        gpus = torch.cuda.device_count()
        layout_batches = packed_batches(cfg.model, max(4, 2 * gpus), 1, args.seq // 4, seed=3)
        single = Run.build(comm, cfg, cfg.train.seed)
        single.train([layout_batches] * 3)
        single.close()
        checks += check_layouts(gpus, "nccl", cfg, layout_batches, 3, single.losses, root)
        resume_batches = packed_batches(cfg.model, 2 * args.resume_steps, 1, args.seq // 2, seed=2)
        ck = CheckpointConfig()
        checks += check_resume(run, resume_batches, args.resume_steps, root, ck.io_threads, ck.max_shard_bytes)
    except Exception as e:  # noqa: BLE001 - the table still prints, with the failure in it
        first_line = str(e).splitlines()[0] if str(e) else ""
        checks.append(Check("the check itself", False, f"{type(e).__name__}: {first_line}"))
        import traceback

        traceback.print_exc()
    finally:
        comm.close()
        shutil.rmtree(root, ignore_errors=True)
    checks.append(Check("wall time", None, f"{time.perf_counter() - started:.0f} s"))
    print_table(checks)
    faulthandler.cancel_dump_traceback_later()
    return 0 if all(c.ok is not False for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
