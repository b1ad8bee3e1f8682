"""`launch --plan`'s numbers against a real run at a tiny size, on one rank (FSDP2 over one, the
trainer's own model and step); the same comparison at dp 2 x tp 2 and hsdp 2 x 2 runs in
tests/integration/test_parallel_layouts.py.

Measured (tests/memory_probe.py): the bytes of the parameters, gradients and AdamW state the rank
holds after a step; the bytes autograd saves for the backward of one micro-batch (forward and loss,
each storage once, gathered weights left out). Each must be within 10% of the estimate. With
activation checkpointing that is each layer's input and the head; the layer recomputed in the
backward is what a layer saves without checkpointing (the other cases; the recompute's own saves
go to torch.utils.checkpoint's hooks, not ours). The FSDP2 transients (gathered weights, the
logits) are estimated, not measured: a CPU has no allocator peak to read them from."""

import dataclasses

import pytest
import torch

from resilient_slurm.config import Config, Layout, LoRAConfig, ModelConfig
from resilient_slurm.data.batches import Batch
from resilient_slurm.parallel import estimate, fsdp
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.trainer.step import StepRunner
from tests.memory_probe import saved_bytes, static_bytes
from tests.single_rank import one_rank

SEQ, MICRO = 64, 2
BASE = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_layers=3, num_heads=4, num_kv_heads=2,
                   max_seq_len=SEQ)
CASES = {
    "llama fp32": BASE,
    "llama bf16, activation checkpointing": dataclasses.replace(BASE, dtype="bfloat16", activation_checkpointing=True),
    "qwen3 bf16 (q/k norms, head_dim 32)": dataclasses.replace(BASE, dtype="bfloat16", qk_norm=True, head_dim=32,
                                                               family="qwen3"),
    "qwen2 fp32 (biases, tied)": dataclasses.replace(BASE, qkv_bias=True, tie_embeddings=True, family="qwen2",
                                                      num_kv_heads=4),
    "llama LoRA": dataclasses.replace(BASE, lora=LoRAConfig(rank=4, targets=["q_proj", "v_proj", "down_proj"])),
}


def batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, BASE.vocab_size, (MICRO, SEQ + 1), generator=g)
    docs = (torch.arange(SEQ) >= SEQ // 3).long().expand(MICRO, SEQ).contiguous()
    pos = torch.arange(SEQ).expand(MICRO, SEQ).contiguous()
    return Batch(ids[:, :-1], ids[:, 1:], pos, docs)


def within(measured: float, estimated: float, what: str) -> None:
    assert measured > 0 and abs(estimated - measured) <= 0.10 * measured, \
        f"{what}: estimated {estimated:.0f} B, measured {measured:.0f} B ({estimated / measured - 1:+.1%})"


@pytest.mark.parametrize("case", CASES)
def test_the_plans_memory_is_within_ten_percent_of_a_real_single_rank_run(case):
    m = CASES[case]
    comm = one_rank()
    model = fsdp.build_model(m, comm.mesh, comm.device)
    fsdp.fill_random(model, m, 0)
    cfg = Config(model=m)
    optimizer = build_optimizer(model, cfg.optim)
    StepRunner(model, optimizer, build_scheduler(optimizer, cfg.optim, 10), comm, 1.0).step([batch(1)])
    lay = Layout(1, 1, 1, 1)

    held, plan = static_bytes(model, optimizer), estimate.static_bytes(m, lay)
    within(held.params, plan.params, "parameters")
    within(held.grads, plan.grads, "gradients")
    within(held.optimizer, plan.optimizer, "AdamW state")

    saved = saved_bytes(model, batch(2), vocab_parallel=False)
    act = estimate.activation_bytes(m, lay, SEQ, MICRO, documents=True)
    if m.activation_checkpointing:
        within(saved, act.layers * act.layer_checkpointed + act.once, "activations kept with checkpointing")
    else:
        within(saved, act.total(False), "activations")
