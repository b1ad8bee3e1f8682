"""Export to a Hugging Face directory, with `transformers` as the oracle: it loads what we wrote and
gives our logits; its tokenizer loads and renders the chat template; and the writer streams (one
output shard alive at a time) and leaves nothing behind when it fails."""

import json
import os
import weakref

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from resilient_slurm.config import ModelConfig  # noqa: E402
from resilient_slurm.export.hf_writer import ExportError, write_hf  # noqa: E402
from resilient_slurm.data.chat.dataset import resolve_path  # noqa: E402
from resilient_slurm.model.decoder import LlamaForCausalLM  # noqa: E402
from resilient_slurm.data.tokenizer import ChatTokenizer  # noqa: E402

TOKENIZER = resolve_path("asset:tiny_chat")
CFG = ModelConfig(vocab_size=485, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  max_seq_len=256, rope_theta=500000.0, bos_token_id=0, eos_token_id=[4, 1], rms_norm_eps=1e-6,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
SHARD = 40_000  # bytes: the float32 embedding (62 KB) gets a file of its own, the rest several
CHAT = [{"role": "user", "content": "Reverse the list: a b c"}, {"role": "assistant", "content": "c b a"}]


def _model(cfg=CFG):
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at ones: make them distinct too
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _export(out, model, cfg=CFG, dtype=torch.float32, read=None, **kwargs):
    state = dict(model.named_parameters())
    tensors = [(name, tuple(p.shape)) for name, p in state.items()]
    return write_hf(str(out), tensors, read or (lambda name: state[name].detach().clone()), cfg, dtype,
                    **{"tokenizer_dir": TOKENIZER, "max_shard_bytes": SHARD, **kwargs})


def _ids():
    return torch.randint(0, CFG.vocab_size, (2, 150), generator=torch.Generator().manual_seed(1))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids) if isinstance(model, LlamaForCausalLM) else model(ids).logits.float()


def test_a_float32_export_loads_in_transformers_with_our_logits(tmp_path):
    model = _model()
    shards = _export(tmp_path / "hf", model)
    out = tmp_path / "hf"
    assert len(shards) >= 3 and not (tmp_path / "hf.tmp").exists()
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert files == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dict(model.named_parameters()))
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    sizes = {n: p.numel() * 4 for n, p in model.named_parameters()}
    for f in files:
        with safe_open(str(out / f), "pt") as st:
            assert st.metadata() == {"format": "pt"}
            names = list(st.keys())
        assert sorted(names) == sorted(n for n, v in index["weight_map"].items() if v == f)
        assert sum(sizes[n] for n in names) <= SHARD or len(names) == 1  # only a lone large tensor exceeds it
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.rope_parameters["rope_type"] == "llama3"
    ids = _ids()
    torch.testing.assert_close(_logits(hf, ids), _logits(model, ids), atol=1e-5, rtol=1e-5)


def test_a_bf16_export_holds_our_weights_rounded_and_transformers_matches_them(tmp_path):
    model = _model()
    _export(tmp_path / "hf", model, dtype=torch.bfloat16)
    out = tmp_path / "hf"
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    written = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            written.update(load_file(str(out / f)))
    assert all(written[n].dtype == torch.bfloat16 and torch.equal(written[n], p.detach().to(torch.bfloat16))
               for n, p in model.named_parameters())
    rounded = LlamaForCausalLM(CFG).eval()
    rounded.load_state_dict({n: t.float() for n, t in written.items()})
    ids = _ids()
    # transformers in float32 over the bf16 file: the same arithmetic as ours over the rounded
    # weights, so float32 noise is all that may differ.
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(hf32, ids), _logits(rounded, ids), atol=1e-5, rtol=1e-5)
    # transformers loading it as it ships (dtype auto: bf16 weights and compute) against our float32
    # model: bf16 keeps 8 significant bits (relative error up to 2^-9 per rounding) and a dozen or so
    # roundings lie on each path through 2 layers, a few tenths of a percent each, partly
    # cancelling; measured 0.6% of the logits' largest magnitude, so 2% bounds it with room while a
    # wrong or misplaced tensor (an error of the logits' own size) fails.
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.dtype == torch.bfloat16
    ours, theirs = _logits(model, ids), _logits(hf, ids)
    assert (theirs - ours).abs().max() <= 0.02 * ours.abs().max()
    assert (theirs.argmax(-1) == ours.argmax(-1)).float().mean() > 0.9


def test_the_tokenizer_loads_and_renders_the_chat_template_like_ours(tmp_path):
    _export(tmp_path / "hf", _model())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tokenizer.apply_chat_template(CHAT, tokenize=True)
    ids = ids if isinstance(ids, list) else ids["input_ids"]  # transformers 5 returns a BatchEncoding
    assert list(ids) == ChatTokenizer(TOKENIZER).apply_chat_template(CHAT)
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, 4]  # the tokenizer directory's, copied


def test_tied_embeddings_leave_out_lm_head_and_load(tmp_path):
    cfg = ModelConfig(**{**CFG.__dict__, "tie_embeddings": True})
    model = _model(cfg)
    state = dict(model.state_dict())  # holds lm_head.weight too: the writer drops it
    write_hf(str(tmp_path / "hf"), [(n, tuple(t.shape)) for n, t in state.items()], lambda n: state[n].clone(), cfg,
             torch.float32, tokenizer_dir=None, max_shard_bytes=10**9)
    assert "lm_head.weight" not in load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text()) == {"eos_token_id": [4, 1],
                                                                                  "bos_token_id": 0}
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = _ids()
    torch.testing.assert_close(_logits(hf, ids), _logits(model, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reads_come_in_shard_order_and_one_shard_at_most_is_alive(tmp_path, dtype):
    model = _model()
    state = {n: p.detach() for n, p in model.named_parameters()}
    refs: dict[str, weakref.ref] = {}
    seen = []  # (name read, names of earlier reads whose tensors are still alive)

    def read(name):
        seen.append((name, [n for n, r in refs.items() if r() is not None]))
        value = state[name].clone()
        refs[name] = weakref.ref(value)
        return value

    shards = _export(tmp_path / "hf", model, dtype=dtype, read=read)
    assert [name for name, _ in seen] == [n for s in shards for n in s.names]
    shard_of = {n: i for i, s in enumerate(shards) for n in s.names}
    for name, alive in seen:
        assert all(shard_of[a] == shard_of[name] for a in alive), (name, alive)
        alive_bytes = sum(state[a].numel() * 4 for a in alive + [name])
        assert alive_bytes <= max(SHARD, state[name].numel() * 4)
        if dtype == torch.bfloat16:
            assert alive == []  # each float32 original is gone once converted
    assert all(r() is None for r in refs.values())


def test_an_interrupted_export_leaves_no_output(tmp_path):
    model = _model()
    state = dict(model.named_parameters())
    calls = []

    def read(name):
        calls.append(name)
        if len(calls) == 12:
            raise OSError("checkpoint shard unreadable")
        return state[name].detach().clone()

    with pytest.raises(OSError, match="unreadable"):
        _export(tmp_path / "hf", model, read=read)
    assert len(calls) == 12 and os.listdir(tmp_path) == []


def test_a_stale_temporary_directory_is_replaced_and_an_existing_output_refused(tmp_path):
    (tmp_path / "hf.tmp").mkdir()
    (tmp_path / "hf.tmp" / "model-00001-of-00009.safetensors").write_bytes(b"partial")
    _export(tmp_path / "hf", _model())
    assert sorted(os.listdir(tmp_path)) == ["hf"]
    assert "model-00001-of-00009.safetensors" not in os.listdir(tmp_path / "hf")
    with pytest.raises(ExportError, match="hf already exists; remove it or choose another output directory"):
        _export(tmp_path / "hf", _model())


@pytest.fixture
def base(tmp_path):
    """A base model directory as the Hub ships one: transformers' own save (transformers 5 spelling,
    `rope_parameters`), the tokenizer, a README and LICENSE, Meta's `original/` folder, and what
    must not travel: other weight formats and a download cache."""
    directory = tmp_path / "base"
    config = transformers.LlamaConfig(
        vocab_size=485, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=[4, 1],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, rope_theta=500000.0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.save_pretrained(directory)
    (directory / "README.md").write_text("# base\n")
    (directory / "LICENSE").write_text("license\n")
    (directory / "original").mkdir()
    (directory / "original" / "params.json").write_text("{}")
    (directory / "original" / "consolidated.00.pth").write_bytes(b"weights")
    (directory / "pytorch_model.bin").write_bytes(b"weights")
    (directory / ".cache").mkdir()
    (directory / ".cache" / "lock").write_text("")
    return directory


def test_an_export_over_a_base_keeps_its_config_and_files(tmp_path, base):
    from resilient_slurm.model.pretrained import apply_pretrained
    cfg = apply_pretrained(ModelConfig(pretrained=str(base)))
    model = _model(cfg)
    _export(tmp_path / "hf", model, cfg, dtype=torch.bfloat16, tokenizer_dir=str(base), base_dir=str(base))
    out = tmp_path / "hf"
    base_config = json.loads((base / "config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config == {**base_config, "dtype": "bfloat16"}  # the base wrote `dtype` only; nothing else changed
    assert (out / "generation_config.json").read_text() == (base / "generation_config.json").read_text()
    for kept in ("README.md", "LICENSE", "original/params.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / kept).read_bytes() == (base / kept).read_bytes(), kept
    for dropped in ("pytorch_model.bin", "original/consolidated.00.pth", ".cache"):
        assert not (out / dropped).exists(), dropped
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    rounded = LlamaForCausalLM(cfg).eval()
    rounded.load_state_dict({n: p.detach().to(torch.bfloat16).float() for n, p in model.named_parameters()})
    ids = _ids()
    torch.testing.assert_close(_logits(hf, ids), _logits(rounded, ids), atol=1e-5, rtol=1e-5)
    assert transformers.AutoTokenizer.from_pretrained(out).apply_chat_template(CHAT, tokenize=False).startswith(
        "<|begin_of_text|>")


def test_a_model_that_differs_from_its_base_is_refused(tmp_path, base):
    cfg = ModelConfig(**{**CFG.__dict__, "intermediate_size": 96})
    with pytest.raises(ExportError, match="has intermediate_size 64 but the model has 96"):
        _export(tmp_path / "hf", _model(cfg), cfg, base_dir=str(base))
    assert not (tmp_path / "hf").exists()


def test_tensors_that_do_not_make_the_model_are_refused(tmp_path):
    model = _model()
    state = dict(model.named_parameters())
    tensors = [(n, tuple(p.shape)) for n, p in state.items()]
    with pytest.raises(ExportError, match="no tensor model.norm.weight"):
        write_hf(str(tmp_path / "a"), [t for t in tensors if t[0] != "model.norm.weight"], state.__getitem__, CFG)
    with pytest.raises(ExportError, match=r"model.norm.weight has shape \[31\] but the model config gives \[32\]"):
        write_hf(str(tmp_path / "b"), [(n, (31,) if n == "model.norm.weight" else s) for n, s in tensors],
                 state.__getitem__, CFG)
    with pytest.raises(ExportError, match=r"read\('model.norm.weight'\) returned shape \[4\]"):
        write_hf(str(tmp_path / "c"), tensors, lambda n: torch.zeros(4) if n == "model.norm.weight" else state[n], CFG)
    assert os.listdir(tmp_path) == []
