"""The PEFT adapter layout as data: key names, adapter_config.json, and which base weight each
adapter pair folds into. peft itself reads what the export writes in tests/integration/test_lora.py."""

import pytest

from resilient_slurm.config import LoRAConfig
from resilient_slurm.export.peft_layout import adapted_weights, adapter_config, peft_name


def test_peft_keys_are_ours_behind_peft_wrappers():
    assert peft_name("model.layers.3.self_attn.q_proj.lora_A.weight") == \
        "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"


def test_adapter_config_says_what_peft_and_vllm_need():
    config = adapter_config(LoRAConfig(rank=16, alpha=32.0, dropout=0.05, targets=["q_proj", "v_proj"]), "/m/llama")
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (16, 32.0, 0.05)
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["base_model_name_or_path"] == "/m/llama"
    # vLLM refuses adapters with trained biases or extra trained modules.
    assert config["bias"] == "none" and config["modules_to_save"] is None and not config["use_dora"]


def test_each_adapted_weight_pairs_its_lora_a_and_b():
    names = [f"model.layers.0.mlp.up_proj.lora_{x}.weight" for x in "AB"]
    assert adapted_weights(names) == {"model.layers.0.mlp.up_proj.weight": tuple(names)}
    with pytest.raises(ValueError, match="no lora_B"):
        adapted_weights(names[:1])
