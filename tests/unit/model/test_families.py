"""Every supported family (Llama, Qwen2/2.5, Qwen3, Mistral) through the one decoder, from tiny models
that the real `transformers` wrote, in both config.json spellings (transformers 4's classic one and
transformers 5's `rope_parameters`): the logits before training are transformers' own, a checkpoint's
export loads with AutoModelForCausalLM as the same class with the same logits, a LoRA adapter export
loads in peft with ours; what the decoder does not build is refused by name. transformers and peft
are the oracles (test-only)."""

import json

import pytest
import torch

from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config, ModelConfig, validate
from resilient_slurm.export.from_checkpoint import export_checkpoint
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.config.families import FAMILIES
from resilient_slurm.model.families import PretrainedError
from resilient_slurm.model.lora import apply_lora
from resilient_slurm.model.pretrained import HFWeights, apply_pretrained, expected_shapes, identity, model_fields
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from tests.hf_families import SPELLINGS, load_theirs, make_family_model
from tests.single_rank import one_rank

transformers = pytest.importorskip("transformers")

CASES = [(family, spelling) for family in FAMILIES for spelling in SPELLINGS]
IDS = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {(f, s): make_family_model(root / f"{f}-{s}", f, s) for f, s in CASES}


def ours(directory):
    cfg = ModelConfig(pretrained=str(directory))
    cfg = apply_pretrained(cfg)
    weights = HFWeights(str(directory))
    weights.check(expected_shapes(cfg))
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            weights.read_rows(name, 0, p.shape[0], p.data)
    return cfg, model


def test_the_spellings_differ_as_the_two_transformers_write_them(saved):
    v5 = json.loads((saved["qwen2", "v5"] / "config.json").read_text())
    v4 = json.loads((saved["qwen2", "v4"] / "config.json").read_text())
    assert "rope_parameters" in v5 and "rope_theta" not in v5 and "layer_types" in v5
    assert "rope_parameters" not in v4 and v4["rope_theta"] == 10000.0 and v4["use_sliding_window"] is False
    assert v4["sliding_window"] == 32768  # set but off, as Qwen2.5's own config.json has it


@pytest.mark.parametrize("family,spelling", CASES)
def test_logits_before_training_are_transformers(saved, family, spelling):
    directory = saved[family, spelling]
    cfg, model = ours(directory)
    theirs = load_theirs(directory)
    assert type(theirs).__name__ == FAMILIES[family].architecture and cfg.family == family
    with torch.no_grad():
        expected, got = theirs(IDS).logits, model(IDS)
    assert expected.abs().max() > 0.1  # logits of substance, so the tolerance means something
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_each_family_turns_on_its_own_switches(saved):
    switches = {f: (c.qkv_bias, c.qk_norm, c.head_dim, c.tie_embeddings, c.sliding_window)
                for f in FAMILIES for c in [ours(saved[f, "v5"])[0]]}
    assert switches == {"llama": (False, False, None, False, None), "qwen2": (True, False, None, True, None),
                        "qwen3": (False, True, 32, False, None), "mistral": (False, False, None, False, 4096)}
    names = set(ours(saved["qwen3", "v4"])[1].state_dict())
    assert {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"} <= names
    assert "model.layers.0.self_attn.q_proj.bias" in set(ours(saved["qwen2", "v4"])[1].state_dict())


def _config(directory, **data):
    cfg = Config()
    cfg.model = apply_pretrained(ModelConfig(pretrained=str(directory)))
    cfg.data.tokenizer = str(directory)
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return cfg


def test_a_sliding_window_shorter_than_the_rows_is_refused_naming_both(saved, tmp_path):
    short = make_family_model(tmp_path / "mistral-short", "mistral", sliding_window=64)
    problems = [p for p in validate(_config(short, seq_len=128)) if "sliding_window" in p]
    assert len(problems) == 1 and "128" in problems[0] and "sliding_window=64" in problems[0]
    assert problems[0].startswith("data.seq_len:") and str(short) in problems[0]
    assert not [p for p in validate(_config(short, seq_len=64)) if "sliding_window" in p]
    # Qwen: only a window that is switched on counts.
    on = make_family_model(tmp_path / "qwen2-window", "qwen2", use_sliding_window=True, sliding_window=32,
                           max_window_layers=0)
    assert ours(on)[0].sliding_window == 32
    assert [p for p in validate(_config(on, seq_len=64)) if "sliding_window=32" in p]
    assert ours(saved["qwen2", "v4"])[0].sliding_window is None


@pytest.mark.parametrize("config,expected", [
    ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}, "model_type gemma2 (Gemma2ForCausalLM)"),
    ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}, "model_type qwen3_moe"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForSequenceClassification"]}, "Qwen2ForSequenceClassification"),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": True}, "attention_bias"),
    ({"model_type": "mistral", "mlp_bias": True}, "mlp_bias"),
])
def test_what_the_decoder_does_not_build_is_refused_by_name(config, expected):
    with pytest.raises(PretrainedError) as err:
        model_fields(config, "/models/x")
    message = str(err.value)
    assert "\n" not in message and expected in message and "/models/x" in message
    if "model_type" in expected:
        assert all(f.architecture in message for f in FAMILIES.values())  # the list of what is supported


def _checkpoint(cfg, root, lora_rank=None):
    """A one-rank checkpoint of `cfg`'s pretrained model after one AdamW step (LoRA adapters with rank)."""
    if lora_rank:
        cfg.model.lora.rank = lora_rank
        cfg.model.lora.targets = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]
    _, model = ours(cfg.model.pretrained)
    model.train()
    if lora_rank:
        apply_lora(model, cfg.model.lora)
    optimizer = build_optimizer(model, cfg.optim)
    model(IDS).float().pow(2).mean().backward()
    optimizer.step()
    base = {"path": cfg.model.pretrained, "identity": identity(cfg.model.pretrained)} if lora_rank else None
    snap = capture_snapshot(model, optimizer, build_scheduler(optimizer, cfg.optim, 10),
                            TrainState(step=1, lora={"rank": lora_rank} if lora_rank else None, base_model=base))
    return model.eval(), save(root / "checkpoints", 1, snap, one_rank(), 1 << 30, 1).path


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_the_export_loads_as_the_same_class_with_equal_logits(saved, family, tmp_path):
    cfg = _config(saved[family, "v4"])
    cfg.optim.lr = 1e-2
    model, ckpt = _checkpoint(cfg, tmp_path)
    export_checkpoint(ckpt, tmp_path / "hf", cfg, dtype=torch.float32)
    theirs = load_theirs(tmp_path / "hf")
    assert type(theirs).__name__ == FAMILIES[family].architecture
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == family
    assert (tmp_path / "hf" / "generation_config.json").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()
    with torch.no_grad():
        got = model(IDS)
        assert (got - load_theirs(saved[family, "v4"])(IDS).logits).abs().max() > 1e-3  # the step changed it
        torch.testing.assert_close(theirs(IDS).logits, got, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_a_lora_export_loads_in_peft_with_our_logits(saved, family, tmp_path):
    peft = pytest.importorskip("peft")
    cfg = _config(saved[family, "v5"])
    cfg.optim.lr = 1e-2
    model, ckpt = _checkpoint(cfg, tmp_path, lora_rank=2)
    export_checkpoint(ckpt, tmp_path / "adapter", cfg)
    theirs = peft.PeftModel.from_pretrained(load_theirs(saved[family, "v5"]), tmp_path / "adapter").eval()
    with torch.no_grad():
        got = model(IDS)
        assert (got - load_theirs(saved[family, "v5"])(IDS).logits).abs().max() > 1e-3  # the adapters moved
        torch.testing.assert_close(theirs(IDS).logits, got, atol=1e-5, rtol=1e-5)
