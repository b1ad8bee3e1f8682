"""Pretrained Hugging Face Llama directories, written by the real `transformers` (the oracle): the
config becomes ModelConfig values, rows read by byte range equal transformers' tensors, and our
model filled from them gives transformers' logits."""

import json
import os
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from resilient_slurm.config import ModelConfig  # noqa: E402
from resilient_slurm.model.decoder import LlamaForCausalLM  # noqa: E402
from resilient_slurm.model.pretrained import (  # noqa: E402
    HFWeights,
    PretrainedError,
    apply_pretrained,
    expected_shapes,
    identity,
    model_fields,
    read_model_config,
)

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
# name → (LlamaConfig overrides, save dtype, max_shard_size)
VARIANTS = {
    "plain": ({}, torch.float32, None),
    "sharded": ({"num_key_value_heads": 2}, torch.float32, "20KB"),
    "bf16": ({}, torch.bfloat16, None),
    # GQA, a head_dim that is not hidden/heads, Llama-3.1 rope scaling whose band between the low and
    # high frequency limits is not empty at head_dim 16 (wavelength 32.4 lies between 16 and 64).
    # (A copy: LlamaConfig adds rope_theta to the dict it is given.)
    "llama31": ({"num_key_value_heads": 2, "head_dim": 16, "rope_theta": 500000.0, "max_position_embeddings": 512,
                 "rope_scaling": dict(LLAMA31_ROPE), "eos_token_id": [2, 3]}, torch.float32, "30KB"),
    "tied": ({"tie_word_embeddings": True}, torch.float32, None),
}


def _save(directory, overrides, dtype, shard):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for p in hf.parameters():  # norms start at ones: make every weight distinct so a mix-up shows
            p.add_(torch.randn_like(p) * 0.05)
    hf.to(dtype).save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    # The oracle is transformers reading the files back, in float32 (its own rotary tables stay
    # float32 that way; a bf16 model cast back would keep bf16-rounded ones).
    return transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: (str(root / name), _save(str(root / name), *spec)) for name, spec in VARIANTS.items()}


def _ours(directory):
    cfg = ModelConfig(**read_model_config(directory))
    weights = HFWeights(directory)
    weights.check(expected_shapes(cfg))
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            weights.read_rows(name, 0, p.shape[0], p.data)
    return model, weights


def test_the_saved_variants_have_the_layouts_they_test(saved):
    assert os.path.isfile(os.path.join(saved["plain"][0], "model.safetensors"))
    for name in ("sharded", "llama31"):
        files = [f for f in os.listdir(saved[name][0]) if f.startswith("model-")]
        assert len(files) >= 3 and os.path.isfile(os.path.join(saved[name][0], "model.safetensors.index.json"))
    assert "lm_head.weight" not in HFWeights(saved["tied"][0]).names()


def test_config_fields_from_a_transformers_directory(saved):
    fields = read_model_config(saved["llama31"][0])
    assert fields == {
        "name": "llama31", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
        "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "max_seq_len": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0, "rope_scaling": LLAMA31_ROPE, "tie_embeddings": False, "bos_token_id": 1,
        "eos_token_id": [2, 3], "family": "llama", "qkv_bias": False, "qk_norm": False, "sliding_window": None,
    }
    plain = read_model_config(saved["plain"][0])
    assert (plain["head_dim"], plain["rope_scaling"], plain["eos_token_id"]) == (None, None, [2])
    assert read_model_config(saved["tied"][0])["tie_embeddings"] is True


def test_the_classic_llama31_config_json_gives_an_8b_model():
    # Meta-Llama-3.1-8B-Instruct's config.json as published (rope_theta and rope_scaling at top level,
    # `torch_dtype`), the spelling transformers 4.x writes; transformers 5 writes `rope_parameters`.
    config = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 128256,
    }
    cfg = ModelConfig(**model_fields(config, "/models/Meta-Llama-3.1-8B-Instruct"))
    assert (cfg.name, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == ("Meta-Llama-3.1-8B-Instruct", 8, None, 5e5)
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}
    assert cfg.eos_token_id == [128001, 128008, 128009]
    assert sum(torch.Size(s).numel() for s in expected_shapes(cfg).values()) == 8_030_261_248


def test_apply_pretrained_keeps_the_users_training_settings(saved):
    user = ModelConfig(pretrained=saved["llama31"][0], dtype="bfloat16", activation_checkpointing=True, init_std=0.01)
    cfg = apply_pretrained(user)
    assert (cfg.dtype, cfg.activation_checkpointing, cfg.init_std, cfg.pretrained) == (
        "bfloat16", True, 0.01, saved["llama31"][0])
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.name) == (2, 16, 96, "llama31")
    assert apply_pretrained(ModelConfig()) == ModelConfig()


@pytest.mark.parametrize("variant", ["plain", "sharded", "bf16", "llama31"])
def test_read_rows_returns_exactly_the_rows_of_the_state_dict(saved, variant):
    directory, hf = saved[variant]
    state = hf.state_dict()
    weights = HFWeights(directory)
    assert set(weights.names()) == set(state)
    for name, ranges in [("model.embed_tokens.weight", [(0, 96), (0, 1), (37, 61), (95, 96), (5, 5)]),
                         ("model.layers.1.self_attn.k_proj.weight", [(3, 9), (0, 2)]),
                         ("model.layers.0.post_attention_layernorm.weight", [(0, 32), (17, 18)]),
                         ("lm_head.weight", [(50, 96)])]:
        assert weights.shape(name) == tuple(state[name].shape)
        for start, stop in ranges:
            out = torch.full((stop - start, *state[name].shape[1:]), float("nan"))
            weights.read_rows(name, start, stop, out)
            assert torch.equal(out, state[name][start:stop]), (name, start, stop)


def test_read_rows_reads_only_the_bytes_of_its_rows(saved):
    weights = HFWeights(saved["bf16"][0])
    data = sum(torch.Size(weights.shape(n)).numel() * 2 for n in weights.names())
    headers = weights.nbytes_read
    assert headers == weights.file_bytes - data  # opening reads the headers and nothing else
    weights.read_rows("model.embed_tokens.weight", 10, 20, torch.empty(10, 32))
    assert weights.nbytes_read - headers == 10 * 32 * 2  # bf16 rows, read as stored
    # One rank's half of every tensor (FSDP2's dim-0 shard): half of the data bytes.
    before = weights.nbytes_read
    for name in weights.names():
        shape = weights.shape(name)
        weights.read_rows(name, 0, shape[0] // 2, torch.empty(shape[0] // 2, *shape[1:]))
    assert data / 2 - 2 * 32 * 2 <= weights.nbytes_read - before <= data / 2


@pytest.mark.parametrize("variant", ["plain", "sharded", "bf16", "llama31", "tied"])
def test_our_model_filled_by_rows_gives_transformers_logits(saved, variant):
    directory, hf = saved[variant]
    ours, _ = _ours(directory)
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert expected.abs().max() > 0.1  # logits of substance, so a tolerance of 1e-5 means something
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_llama31_scaling_changes_logits_and_we_match_it_at_long_positions(saved):
    directory, hf = saved["llama31"]
    ours, _ = _ours(directory)
    unscaled = LlamaForCausalLM(ModelConfig(**{**read_model_config(directory), "rope_scaling": None})).eval()
    unscaled.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 96, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, got, plain = hf(ids).logits, ours(ids), unscaled(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (plain - expected).abs().max() > 1e-2


def test_packed_documents_give_each_documents_own_logits(saved):
    directory, hf = saved["llama31"]
    ours, _ = _ours(directory)
    gen = torch.Generator().manual_seed(3)
    first, second = torch.randint(0, 96, (1, 9), generator=gen), torch.randint(0, 96, (1, 14), generator=gen)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(9), torch.arange(14)])[None]
    documents = torch.tensor([[0] * 9 + [1] * 14])
    with torch.no_grad():
        got = ours(packed, positions, documents)
        torch.testing.assert_close(got[:, :9], hf(first).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[:, 9:], hf(second).logits, atol=1e-5, rtol=1e-5)
        # Without the document mask the second document would see the first: the mask matters.
        assert (ours(packed, positions)[:, 9:] - hf(second).logits).abs().max() > 1e-3


def test_identity_names_the_weights_not_the_directory(saved, tmp_path):
    directory = saved["sharded"][0]
    copy = shutil.copytree(directory, tmp_path / "copy")
    assert identity(directory) == identity(str(copy)) != identity(saved["plain"][0])
    tuned = tmp_path / "tuned"
    hf = saved["sharded"][1]
    with torch.no_grad():
        hf.model.layers[1].mlp.up_proj.weight[0, 0] += 1e-3
        hf.save_pretrained(tuned, max_shard_size="20KB")
        hf.model.layers[1].mlp.up_proj.weight[0, 0] -= 1e-3
    assert identity(str(tuned)) != identity(directory)


DROP = object()


def _edit_config(directory, **changes):
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in changes.items():
        config.pop(key, None)
        if value is not DROP:
            config[key] = value
    with open(path, "w") as f:
        json.dump(config, f)


def test_another_architecture_is_refused_by_name(tmp_path):
    config = transformers.Phi3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    transformers.Phi3ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(PretrainedError, match=r"model_type phi3 \(Phi3ForCausalLM\) is not supported; resilient_slurm "
                                              r"fine-tunes llama \(LlamaForCausalLM\), qwen2 \(Qwen2ForCausalLM\)") as e:
        read_model_config(str(tmp_path))
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}},
     "rope type yarn is not supported"),
    ({"rope_parameters": DROP, "rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope type dynamic is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     "llama3 rope scaling lacks low_freq_factor"),
    ({"attention_bias": True}, "attention_bias: true"),
    ({"mlp_bias": True}, "mlp_bias: true"),
    ({"model_type": "phi3", "architectures": DROP}, "model_type phi3 is not supported"),
    ({"model_type": "qwen2"}, "architecture LlamaForCausalLM is not supported for model_type qwen2"),
    ({"hidden_size": DROP}, "config.json lacks hidden_size"),
])
def test_unsupported_config_gives_one_line_error_naming_the_directory(saved, tmp_path, changes, message):
    directory = str(shutil.copytree(saved["plain"][0], tmp_path / "model"))
    _edit_config(directory, **changes)
    with pytest.raises(PretrainedError, match=message) as e:
        read_model_config(directory)
    assert directory in str(e.value) and "\n" not in str(e.value)


def test_a_missing_shard_is_named_with_its_directory(saved, tmp_path):
    directory = str(shutil.copytree(saved["sharded"][0], tmp_path / "model"))
    shard = sorted(f for f in os.listdir(directory) if f.startswith("model-"))[1]
    os.remove(os.path.join(directory, shard))
    with pytest.raises(PretrainedError, match=f"weight file {shard} named by model.safetensors.index.json is "
                                              "missing") as e:
        HFWeights(directory)
    assert directory in str(e.value) and "\n" not in str(e.value)


def test_no_weights_at_all_is_refused(tmp_path):
    with pytest.raises(PretrainedError, match="no model.safetensors and no model.safetensors.index.json"):
        HFWeights(str(tmp_path))


def test_vocabulary_and_shape_mismatches_are_named(saved):
    weights = HFWeights(saved["plain"][0])
    cfg = ModelConfig(**read_model_config(saved["plain"][0]))
    weights.check(expected_shapes(cfg))
    with pytest.raises(PretrainedError, match="vocabulary mismatch: model.embed_tokens.weight has 96 rows but the "
                                              "model config has vocab_size 128"):
        weights.check(expected_shapes(ModelConfig(**{**read_model_config(saved["plain"][0]), "vocab_size": 128})))
    with pytest.raises(PretrainedError, match=r"model.layers.0.mlp.gate_proj.weight has shape \[64, 32\] in the "
                                              r"files but \[80, 32\]"):
        weights.check(expected_shapes(ModelConfig(**{**read_model_config(saved["plain"][0]),
                                                     "intermediate_size": 80})))


def test_an_untied_config_over_tied_weights_names_the_missing_lm_head(saved, tmp_path):
    directory = shutil.copytree(saved["tied"][0], tmp_path / "model")
    _edit_config(directory, tie_word_embeddings=False)
    cfg = ModelConfig(**read_model_config(str(directory)))
    with pytest.raises(PretrainedError, match="tensor lm_head.weight of the model is in none of the weight files"):
        HFWeights(str(directory)).check(expected_shapes(cfg))


def test_read_rows_refuses_a_wrong_target(saved):
    weights = HFWeights(saved["plain"][0])
    with pytest.raises(PretrainedError, match="outside its 96 rows"):
        weights.read_rows("model.embed_tokens.weight", 90, 97, torch.empty(7, 32))
    with pytest.raises(PretrainedError, match=r"need a contiguous CPU tensor of shape \[4, 32\]"):
        weights.read_rows("model.embed_tokens.weight", 0, 4, torch.empty(4, 31))
