from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from resilient_slurm.config import Config, ConfigError, to_config, validate

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("experiment", ["tiny_sft", "llama8b_sft"])
def test_experiments_compose_and_validate(experiment):
    cfg = to_config(composed(f"+experiment={experiment}"))
    assert cfg.run.experiment == experiment


def test_tiny_is_the_8b_recipe_scaled_down():
    tiny = to_config(composed("+experiment=tiny_sft"))
    big = to_config(composed("+experiment=llama8b_sft"))
    assert big.model.hidden_size == 4096 and big.model.num_layers == 32 and big.model.num_kv_heads == 8
    assert big.data.seq_len == 4096 and big.optim.lr == pytest.approx(1e-4)
    same = lambda a, b: {k: v for k, v in a.__dict__.items()} == {k: v for k, v in b.__dict__.items()}
    assert tiny.data.mix == big.data.mix and tiny.train.seed == big.train.seed
    tiny_optim = dict(tiny.optim.__dict__, warmup_steps=None)
    big_optim = dict(big.optim.__dict__, warmup_steps=None)
    assert tiny_optim == big_optim
    assert not same(tiny.model, big.model)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=abc", "optim.lr"),
        ("optim.lr=-1", "optim.lr"),
        ("checkpoint.keep_last=1", "checkpoint.keep_last"),
        ("model.num_kv_heads=3", "model.num_kv_heads"),
        ("data.global_batch_size=7", "data.global_batch_size"),
        ("data.seq_len=1024", "data.seq_len"),
        ("+data.mix.translate=1.0", "data.mix"),
        ("cluster.ranks=0", "cluster.ranks"),
        ("run.name=../escape", "run.name"),
        ("model.dtype=float8", "model.dtype"),
        ("tracking.mode=cloud", "tracking.mode"),
        ("eval.every_steps=-1", "eval.every_steps"),
        ("data.val_samples=0", "data.val_samples"),
        ("run.baseline=../x", "run.baseline"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", override))
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message


def test_defaults_are_valid():
    assert validate(Config()) == []


def test_tracking_is_offline_and_eval_on_by_default_for_the_recipes():
    tiny = to_config(composed("+experiment=tiny_sft"))
    assert tiny.tracking.mode == "offline" and tiny.eval.every_steps > 0
    assert to_config(composed("+experiment=tiny_sft", "tracking.mode=disabled", "run.fork=true")).run.fork


def test_data_chat_selects_the_chat_pipeline():
    cfg = to_config(composed("+experiment=tiny_sft", "data=chat", "data.path=/data/chat.jsonl"))
    assert (cfg.data.kind, cfg.data.path, cfg.data.loss, cfg.data.overlong, cfg.data.bad_lines) == (
        "chat", "/data/chat.jsonl", "assistant", "truncate", "error")
    tiny = to_config(composed("+experiment=tiny_sft", "data=tiny_chat"))
    assert tiny.data.path.startswith("asset:") and tiny.data.tokenizer == "asset:tiny_chat"


@pytest.mark.parametrize("override, key", [
    ("data.loss=prompt", "data.loss"),
    ("data.overlong=wrap", "data.overlong"),
    ("data.bad_lines=ignore", "data.bad_lines"),
    ("data.kind=web", "data.kind"),
    ("data.path=", "data.path"),
])
def test_bad_chat_values_give_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", "data=chat", "data.path=/data/chat.jsonl", override))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
