"""LoRA on the project's Llama: where the adapters go, what trains, what a new adapter changes (nothing),
that merging gives the same function, and bad targets."""

import math

import pytest
import torch

from resilient_slurm.config import LORA_TARGETS, LoRAConfig, ModelConfig
from resilient_slurm.model.lora import LoRAError, adapter_value, apply_lora, is_adapter, merged_weight
from resilient_slurm.model.decoder import DecoderLayer, plain_model

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  max_seq_len=32)


def with_adapters(lora: LoRAConfig, seed: int = 0):
    model = plain_model(CFG, seed)
    adapted = apply_lora(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter(name):
                p.copy_(adapter_value(name, tuple(p.shape), seed))
    return model.eval(), adapted


def test_the_targets_named_in_config_are_the_linear_layers_of_a_decoder_layer():
    linear = {name for name, m in DecoderLayer(CFG).named_modules() if isinstance(m, torch.nn.Linear)}
    assert {name.rsplit(".", 1)[-1] for name in linear} == set(LORA_TARGETS)


def test_adapters_go_on_the_targets_of_every_layer_and_only_they_train():
    model, adapted = with_adapters(LoRAConfig(rank=4, targets=["q_proj", "down_proj"]))
    assert adapted == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj",
                       "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {f"{m}.{ab}.weight" for m in adapted for ab in ("lora_A", "lora_B")}
    # The base keeps its Hugging Face names, so it loads and exports as before.
    assert set(plain_model(CFG, 0).state_dict()) <= set(model.state_dict())
    sd = model.state_dict()
    assert sd["model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)
    assert sd["model.layers.0.mlp.down_proj.lora_B.weight"].shape == (32, 4)


def test_a_new_adapter_changes_nothing_and_its_initial_values_depend_on_seed_and_name_alone():
    base = plain_model(CFG, 0).eval()
    model, _ = with_adapters(LoRAConfig(rank=4))
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids), base(ids))  # B starts at zero
    a = adapter_value("model.layers.0.self_attn.q_proj.lora_A.weight", (4, 32), seed=3)
    assert torch.equal(a, adapter_value("model.layers.0.self_attn.q_proj.lora_A.weight", (4, 32), seed=3))
    assert not torch.equal(a, adapter_value("model.layers.1.self_attn.q_proj.lora_A.weight", (4, 32), seed=3))
    assert a.abs().max() <= 1 / math.sqrt(32) and a.std() > 0.5 / math.sqrt(32 * 3)  # uniform in +-1/sqrt(in)


def test_a_trained_adapter_merged_into_its_weight_computes_the_same_function():
    lora = LoRAConfig(rank=4, alpha=8.0, targets=["v_proj", "up_proj"])
    model, adapted = with_adapters(lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    merged = plain_model(CFG, 0).eval()
    sd = model.state_dict()
    with torch.no_grad():
        for module in adapted:
            weight = merged.get_parameter(f"{module}.weight")
            weight.copy_(merged_weight(sd[f"{module}.weight"], sd[f"{module}.lora_A.weight"],
                                       sd[f"{module}.lora_B.weight"], lora.alpha / 4))
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, folded, base = model(ids), merged(ids), plain_model(CFG, 0)(ids)
    assert (ours - base).abs().max() > 1e-2  # the adapters do something
    torch.testing.assert_close(folded, ours, rtol=0, atol=1e-5)


def test_a_target_that_matches_no_layer_is_one_line_naming_it_and_the_choices():
    with pytest.raises(LoRAError) as err:
        apply_lora(plain_model(CFG, 0), LoRAConfig(rank=4, targets=["q_proj", "lm_head"]))
    message = str(err.value)
    assert "\n" not in message and message.startswith("model.lora.targets: 'lm_head' matches no layer")
    assert "down_proj" in message and "q_proj" in message


def test_dropout_acts_on_the_adapter_input_while_training_only():
    model, _ = with_adapters(LoRAConfig(rank=4, dropout=0.5))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.fill_(0.1)
    ids = torch.randint(0, CFG.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        evaluated = [model(ids) for _ in range(2)]
        model.train()
        trained = [model(ids) for _ in range(2)]
    assert torch.equal(*evaluated) and not torch.equal(*trained)
