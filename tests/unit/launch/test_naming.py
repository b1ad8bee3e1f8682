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


def test_an_sft_run_is_named_by_the_model_and_the_data_base_names_not_their_paths():
    from datetime import date

    from resilient_slurm.config import Config
    from resilient_slurm.launch.naming import run_name

    c = Config()
    c.model.name = "Llama-3.2-1B-Instruct"  # what apply_pretrained sets from the directory's name
    c.model.pretrained, c.data.path = "/models/Llama-3.2-1B-Instruct", "/data/support_v2.jsonl"
    overrides = ["+experiment=sft", f"model.pretrained={c.model.pretrained}", f"data.path={c.data.path}",
                 "optim.lr=3e-4", "data.tokenizer=/models/tok"]
    assert run_name(c, overrides, date(2026, 12, 1)) == "Llama-3.2-1B-Instruct-support_v2-20261201-lr3e-4"
    c.data.path = "/data/chats/"  # a directory of .jsonl files
    assert run_name(c, overrides[:3], date(2026, 12, 1)) == "Llama-3.2-1B-Instruct-chats-20261201-base"
    assert run_name(Config(), [], date(2026, 12, 1)) == "llama-tiny-tiny-chat-20261201-base"  # the shipped set


def test_a_long_value_is_a_short_digest_in_the_name_and_whole_in_run_json(tmp_path):
    """Issue 27, item 16: overriding data.sources gave a 162-character name that clipped the report's
    title. The name keeps the key's short name and a digest; run.json keeps the value whole."""
    import json
    from datetime import date

    from resilient_slurm.config import explicit_keys, to_config
    from resilient_slurm.config.composer import compose
    from resilient_slurm.launch.naming import digested
    from resilient_slurm.launch.prepare import prepare

    sources = ("data.sources=[{name:web,path:/data/tok/web,weight:0.7},{name:code,path:/data/tok/code,weight:0.2},"
               "{name:book,path:/data/tok/book,weight:0.1}]")
    overrides = ["+experiment=tiny_pretrain", sources, "optim.lr=3e-4", f"run.root={tmp_path}"]
    name = variant(overrides)
    assert name.startswith("sources-") and name.endswith("-lr3e-4") and len(name) == len("sources-123456-lr3e-4")
    assert variant(overrides) == name  # the same value, the same name: a relaunch finds the run
    assert variant([sources.replace("0.7", "0.6")] + overrides[2:]) != name
    assert digested(overrides) == {name.removesuffix("-lr3e-4"): sources}
    cfg = to_config(compose(overrides), explicit_keys(overrides))
    run_dir, _ = prepare(cfg, overrides, date(2026, 12, 1))
    assert len(run_dir.name) < 60 and run_dir.name.endswith(name)
    assert json.loads((run_dir / "run.json").read_text())["name_digests"] == {name.removesuffix("-lr3e-4"): sources}


def test_short_values_are_spelled_and_run_json_has_no_digests(tmp_path):
    assert variant(["optim.lr=3e-4", "model.lora.targets=[q_proj,v_proj]"]) == "lr3e-4-targets-qv"
    from resilient_slurm.launch.naming import digested

    assert digested(["optim.lr=3e-4"]) == {}
