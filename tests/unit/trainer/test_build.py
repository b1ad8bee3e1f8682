"""What a rank builds before training: the sharded model from a pretrained Hugging Face directory gives
transformers' logits (transformers is the oracle), and every bad input stops with one line naming the
file and the fix. One rank in this process (FSDP2 on a mesh of one)."""

import json
import os
import shutil

import pytest
import torch

from resilient_slurm.rundir import RunDir
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.errors import InputError
from resilient_slurm.trainer import build
from resilient_slurm.data.open import open_data
from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.model.pretrained import apply_pretrained
from resilient_slurm.data.chat.tiny import conversations
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
    with pytest.raises(InputError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "chat.jsonl", list(conversations(300, seed=1)) + ['{"messages": [{"role": "user"}'])
    message = one_line_error(lambda: open_data(config(tmp_path, path=path, val_samples=10), tmp_path, one_rank()))
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
    assert "chat template" in one_line_error(lambda: open_data(cfg, tmp_path, one_rank()))


def test_a_vocabulary_the_model_cannot_embed_is_refused(tmp_path):
    cfg = config(tmp_path)
    cfg.model.vocab_size = 300  # the shipped tokenizer has 485 tokens
    assert "vocabulary mismatch" in one_line_error(lambda: open_data(cfg, tmp_path, one_rank()))


def test_a_resume_against_changed_data_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path / "chat.jsonl", conversations(50, seed=1))
    cfg = config(tmp_path, path=path, val_samples=5)
    open_data(cfg, tmp_path, one_rank())  # the first start records the data
    assert RunDir(tmp_path).data_record.is_file()
    write(tmp_path / "chat.jsonl", conversations(51, seed=1))
    assert path in one_line_error(lambda: open_data(cfg, tmp_path, one_rank()))


def test_a_missing_shard_of_the_pretrained_weights_is_named(pretrained, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pretrained, broken)
    shard = sorted(broken.glob("model-*.safetensors"))[1]
    shard.unlink()
    message = one_line_error(lambda: build.build_model(config(tmp_path, broken), one_rank()))
    assert shard.name in message and str(broken) in message


def test_a_lora_model_holds_its_base_in_bf16_trains_only_adapters_and_starts_as_its_base(pretrained, tmp_path):
    from resilient_slurm.checkpoint.state import capture_snapshot
    from resilient_slurm.checkpoint.train_state import TrainState
    from resilient_slurm.trainer.optim import build_optimizer, build_scheduler

    cfg = config(tmp_path, pretrained)
    cfg.model.lora.rank = 4
    model = build.build_model(cfg, one_rank())
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    # A new adapter adds zero: the model is the base as held (bf16 weights), computed in float32.
    oracle = transformers.LlamaForCausalLM.from_pretrained(pretrained, dtype=torch.bfloat16).float().eval()
    ids = torch.randint(0, 512, (2, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), oracle(ids).logits, rtol=0, atol=1e-5)
    model.reshard()
    optimizer = build_optimizer(model, cfg.optim)
    model(ids).float().mean().backward()
    optimizer.step()
    snap = capture_snapshot(model, optimizer, build_scheduler(optimizer, cfg.optim, 10), TrainState(step=1))
    adapters = {n for n in dtypes if ".lora_" in n}
    assert set(snap.model) == adapters and len(adapters) == 2 * 4 * cfg.model.num_layers
    assert {n.rsplit(".", 1)[0] for n in snap.optimizer} == adapters


def test_a_lora_run_refuses_checkpoints_of_another_base_or_another_kind_of_training(tmp_path):
    cfg = config(tmp_path)
    cfg.model.lora.rank = 8
    base = {"path": "/models/a", "identity": "a" * 64}
    stamp = build.lora_stamp(cfg, base)
    lora = stamp["lora"]
    assert stamp["base_model"] == base and lora["rank"] == 8
    assert build.resume_refusal(TrainState(step=5, **stamp), cfg, base) is None
    other = build.resume_refusal(TrainState(step=5, lora=lora, base_model={"path": "/models/a", "identity": "b" * 64}), cfg, base)
    assert other and "/models/a" in other and "b" * 16 in other and "a" * 16 in other and "\n" not in other
    full = build.resume_refusal(TrainState(step=5), cfg, base)
    assert full and full.startswith("a checkpoint of a full fine-tune") and "model.lora.rank=8" in full
    cfg.model.lora.rank = None
    assert build.resume_refusal(TrainState(step=5), cfg, None) is None
    assert "model.lora.rank=8" in (build.resume_refusal(TrainState(step=5, lora=lora, base_model=base), cfg, None) or "")
