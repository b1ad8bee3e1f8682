"""What a rank builds before training: the sharded model from a pretrained Hugging Face directory gives
transformers' logits (transformers is the oracle), and every bad input stops with one line naming the
file and the fix. One rank in this process (FSDP2 on a mesh of one)."""

import json
import os
import shutil

import pytest
import torch

from resilient_slurm.config import Config
from resilient_slurm.runtime import build
from resilient_slurm.workload.chat_data import resolve_path
from resilient_slurm.workload.pretrained import apply_pretrained
from resilient_slurm.workload.tiny_chat import conversations
from tests.hf_model import make_hf_model
from tests.single_rank import one_rank

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("hf") / "small-llama", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})


def config(tmp_path, pretrained=None, **data):
    cfg = Config()
    cfg.run.root = str(tmp_path)
    if pretrained:
        cfg.model.pretrained = str(pretrained)
        cfg.model = apply_pretrained(cfg.model)
        cfg.data.tokenizer = ""
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return cfg


def test_the_sharded_model_from_a_pretrained_directory_gives_transformers_logits(pretrained, tmp_path):
    cfg = config(tmp_path, pretrained)
    assert cfg.model.rope_scaling and cfg.model.rope_scaling["rope_type"] == "llama3"
    model = build.build_model(cfg, one_rank())
    oracle = transformers.LlamaForCausalLM.from_pretrained(pretrained, dtype=torch.float32).eval()
    ids = torch.randint(0, 512, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)
        model.reshard()
        theirs = oracle(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()


def write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def one_line_error(fn):
    with pytest.raises(build.InputError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "chat.jsonl", list(conversations(300, seed=1)) + ['{"messages": [{"role": "user"}'])
    message = one_line_error(lambda: build.open_data(config(tmp_path, path=path, val_samples=10), tmp_path, one_rank()))
    assert f"{path}:301" in message and "data.bad_lines=skip" in message


def test_a_tokenizer_without_a_chat_template_is_named(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(os.path.join(resolve_path("asset:tiny_chat"), "tokenizer.json"), tok / "tokenizer.json")
    body = json.loads(open(os.path.join(resolve_path("asset:tiny_chat"), "tokenizer_config.json")).read())
    body.pop("chat_template", None)
    (tok / "tokenizer_config.json").write_text(json.dumps(body))
    cfg = config(tmp_path, path=write(tmp_path / "c.jsonl", conversations(50, seed=1)), tokenizer=str(tok),
                 val_samples=5)
    assert "chat template" in one_line_error(lambda: build.open_data(cfg, tmp_path, one_rank()))


def test_a_vocabulary_the_model_cannot_embed_is_refused(tmp_path):
    cfg = config(tmp_path)
    cfg.model.vocab_size = 300  # the shipped tokenizer has 485 tokens
    assert "vocabulary mismatch" in one_line_error(lambda: build.open_data(cfg, tmp_path, one_rank()))


def test_a_resume_against_changed_data_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path / "chat.jsonl", conversations(50, seed=1))
    cfg = config(tmp_path, path=path, val_samples=5)
    build.open_data(cfg, tmp_path, one_rank())  # the first start records the data
    assert (tmp_path / build.DATA_RECORD).is_file()
    write(tmp_path / "chat.jsonl", conversations(51, seed=1))
    assert path in one_line_error(lambda: build.open_data(cfg, tmp_path, one_rank()))


def test_a_missing_shard_of_the_pretrained_weights_is_named(pretrained, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pretrained, broken)
    shard = sorted(broken.glob("model-*.safetensors"))[1]
    shard.unlink()
    message = one_line_error(lambda: build.build_model(config(tmp_path, broken), one_rank()))
    assert shard.name in message and str(broken) in message
