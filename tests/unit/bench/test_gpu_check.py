"""bench/gpu_check.py without a GPU: the one-line refusal, the MFU arithmetic, and its checks run on
the CPU (one gloo rank, a tiny tied model; its layouts check on 2 gloo ranks), where they must pass
as they would on a GPU. What needs a GPU (cuBLAS, pinned staging, NVML readings, NCCL) is not
exercised here, nor the compiled-blocks check (a compiled block's first step takes about a minute
on this CPU; tests/integration/test_compiled_blocks.py compiles through the trainer)."""

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from resilient_slurm.config import Config, ModelConfig, OptimConfig
from resilient_slurm.model.decoder import LlamaForCausalLM
from tests.single_rank import one_rank
from tests.unit.bench.conftest import BENCH, load_bench, spawnable

gpu_check = load_bench("gpu_check")

LLAMA3_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                        num_kv_heads=8)


def test_without_cuda_it_says_so_in_one_line_and_exits_2():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even where one exists
    done = subprocess.run([sys.executable, str(BENCH / "gpu_check.py")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == gpu_check.NO_GPU_EXIT == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device"), lines


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA GeForce RTX 4090", None),
])
def test_peak_bf16_by_device_name(name, tflops):
    peak = gpu_check.peak_bf16_flops(name)
    assert peak == (None if tflops is None else tflops * 1e12)


def test_matmul_parameters_are_the_model_less_its_embedding_lookup_and_norms():
    for cfg in (gpu_check.LLAMA_1B, LLAMA3_8B):
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
        norms = sum(p.numel() for n, p in model.named_parameters() if n.endswith("norm.weight"))
        embedding = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size  # tied: it is lm_head's product
        assert gpu_check.matmul_params(cfg) == sum(p.numel() for p in model.parameters()) - norms - embedding
    assert gpu_check.matmul_params(gpu_check.LLAMA_1B) == 1_235_746_816  # Llama-3.2-1B: 1,235,814,400 with norms


def test_mfu_is_model_flops_over_the_peak():
    # Llama-3-8B at seq 4096: 6 x 7,504,658,432 matmul weights + 12 x 32 layers x 32 heads x 128 x 4096.
    per_token = 6 * 7_504_658_432 + 12 * 32 * 32 * 128 * 4096
    assert gpu_check.flops_per_token(LLAMA3_8B, 4096) == per_token
    assert gpu_check.mfu(3000.0, LLAMA3_8B, 4096, 989e12) == pytest.approx(3000.0 * per_token / 989e12)
    assert 0.15 < gpu_check.mfu(3000.0, LLAMA3_8B, 4096, 989e12) < 0.17


def test_the_steps_and_the_exact_resume_pass_on_one_cpu_rank(tmp_path):
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, tie_embeddings=True, dtype="bfloat16")
    cfg = Config(model=model, optim=replace(OptimConfig(), warmup_steps=0, lr=1e-2))
    run = gpu_check.Run.build(one_rank(), cfg, seed=3)
    batches = gpu_check.packed_batches(model, count=2, micro=2, seq=32, seed=1)
    assert batches[0].position_ids[0, 16] == 0 and batches[0].document_ids[0, 16] == 1  # two documents per row
    checks, timing = gpu_check.check_steps(run, batches, accumulation=2, steps=2)
    assert set(timing) == {"deterministic", "default"} and all(t > 0 for t in timing.values())
    checks += gpu_check.check_resume(run, gpu_check.packed_batches(model, 4, 1, 16, seed=2), k=2, root=tmp_path,
                                     io_threads=2, max_shard_bytes=1 << 20)
    failed = [c for c in checks if c.ok is False]
    assert not failed, failed
    names = " ".join(c.name for c in checks)
    for expected in ("compute dtype", "losses finite", "async save", "restore: weights", "cpu RNG restored",
                     "weights bit-identical", "losses identical"):
        assert expected in names


def test_the_layouts_it_checks_fit_the_gpus():
    assert gpu_check.layouts_for(1) == {}
    assert list(gpu_check.layouts_for(2)) == ["dp 2", "dp 1 x tp 2"]
    assert list(gpu_check.layouts_for(8)) == ["dp 8", "dp 4 x tp 2", "hsdp 2 x 4"]
    assert all(lay.world_size == 8 for lay in gpu_check.layouts_for(8).values())


@pytest.mark.slow
def test_the_layouts_check_passes_on_two_cpu_ranks(tmp_path, monkeypatch):
    spawnable("gpu_check", tmp_path, monkeypatch)
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, tie_embeddings=True, dtype="bfloat16")
    cfg = Config(model=model, optim=replace(OptimConfig(), warmup_steps=0, lr=1e-2))
    batches = gpu_check.packed_batches(model, count=4, micro=1, seq=32, seed=3)
    single = gpu_check.Run.build(one_rank(), cfg, cfg.train.seed)
    single.train([batches] * 2)
    checks = gpu_check.check_layouts(2, "gloo", cfg, batches, 2, single.losses, tmp_path)
    assert [c.name.split(":")[0] for c in checks] == ["layout dp 2", "layout dp 1 x tp 2"]
    assert all(c.ok for c in checks), checks
