"""Ablation group names, spelled from the keys that differ from the baseline."""

import pytest

from resilient_slurm.launch.naming import ablation_group, variant


@pytest.mark.parametrize(
    "changed, expected",
    [
        ({"optim.lr": (1e-4, 3e-4)}, "ablation-lr-1e-4-vs-3e-4"),
        ({"data.global_batch_size": (32, 64)}, "ablation-bs-32-vs-64"),
        ({"model.tie_embeddings": (False, True)}, "ablation-tieembeddings-false-vs-true"),
        ({"model.dtype": ("float32", "bfloat16")}, "ablation-dtype-float32-vs-bfloat16"),
        ({"optim.lr": (1e-4, 3e-4), "data.seq_len": (128, 256)}, "ablation-seq+lr-128+1e-4-vs-256+3e-4"),
        ({k: (1, 2) for k in ("a.x", "a.y", "a.z", "a.w")}, "ablation-4keys-base-vs-run"),
        ({}, "ablation-none-base-vs-run"),
    ],
)
def test_ablation_group(changed, expected):
    assert ablation_group(changed, "base", "run") == expected


def test_tracking_and_eval_overrides_are_not_a_variant():
    assert variant(["tracking.mode=disabled", "eval.every_steps=5", "run.fork=true"]) == "base"


def test_lora_runs_carry_their_variant_and_a_targets_ablation_is_named_after_the_targets():
    assert variant(["model.lora.rank=16"]) == "lora-r16"
    assert variant(["model.lora.rank=8", "model.lora.targets=[q_proj,k_proj,v_proj]"]) == "lora-r8-targets-qkv"
    qkvo, qkv = ["q_proj", "k_proj", "v_proj", "o_proj"], ["q_proj", "k_proj", "v_proj"]
    assert ablation_group({"model.lora.targets": (qkvo, qkv)}, "base", "run") == "ablation-targets-qkvo-vs-qkv"
    assert ablation_group({"model.lora.rank": (None, 16)}, "base", "run") == "ablation-lora-r-none-vs-16"
