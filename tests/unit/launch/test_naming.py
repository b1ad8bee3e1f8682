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
