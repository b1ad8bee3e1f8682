"""prepare (Hydra overrides and plain flags), the tokens pipeline's config keys, the token budget,
and the tiny corpus going through tokenize → prepare → batches on a fresh cache."""

import pytest

from resilient_slurm.config import Config, ConfigError, SourceConfig, to_config, to_dict, train_steps, validate
from resilient_slurm.data.__main__ import main
from resilient_slurm.data.tokens.tiny_corpus import documents
from resilient_slurm.data.tokens.token_data import open_token_data
from resilient_slurm.data.tokens.tiny_pretrain import tiny_pretrain_prefixes
from tests.token_corpora import two_sources


def test_prepare_with_hydra_overrides_builds_what_the_run_start_then_maps(tmp_path, capsys):
    (web, web_path, _), (code, code_path, _) = two_sources(tmp_path)
    sources = f"[{{name:web,path:'{web_path}',weight:0.7}},{{name:code,path:'{code_path}',weight:0.3}}]"
    args = ["data.kind=tokens", f"data.sources={sources}", "data.seq_len=16", "data.val_sequences=4",
            "train.max_steps=40", "data.tokenizer=asset:tiny_chat", f"run.root={tmp_path}"]
    assert main(["prepare", *args]) == 0
    out = capsys.readouterr().out
    assert "source=web" in out and "built=2" in out and "source=(total)" in out
    assert main(["prepare", *args]) == 0 and "built=0" in capsys.readouterr().out  # the second time: all there


def test_prepare_with_plain_flags(tmp_path, capsys):
    (_, web, _), (_, code, _) = two_sources(tmp_path)
    code_ = main(["prepare", "--source", f"name=web,path={web},weight=0.7", "--source", f"name=code,path={code},weight=0.3",
                  "--seq-len", "16", "--val-sequences", "4", "--max-steps", "40", "--index-dir", str(tmp_path / "idx")])
    assert code_ == 0 and "source=code" in capsys.readouterr().out and (tmp_path / "idx").is_dir()
    assert main(["prepare", "--source", f"name=web,path={tmp_path / 'nope'},weight=1"]) == 2
    assert "does not exist" in capsys.readouterr().err


def tokens_cfg(**sources_and_data):
    cfg = Config()
    cfg.data.kind = "tokens"
    cfg.data.sources = sources_and_data.pop("sources", [SourceConfig("web", "/d/web", 1.0)])
    for k, v in sources_and_data.items():
        setattr(cfg.data, k, v)
    return cfg


@pytest.mark.parametrize("change, message", [
    (dict(sources=[]), "data.sources: empty; give the mixture"),
    (dict(sources=[SourceConfig("web", "/d", 0.0)]), "data.sources[web].weight: 0.0; set a weight > 0"),
    (dict(sources=[SourceConfig("web", "/d", -1.0)]), "data.sources[web].weight: -1.0"),
    (dict(sources=[SourceConfig("w b", "/d", 1.0)]), "data.sources[0].name: 'w b' is not a plain name"),
    (dict(sources=[SourceConfig("web", "", 1.0)]), "data.sources[web].path: empty"),
    (dict(sources=[SourceConfig("a", "/d", 1.0), SourceConfig("a", "/e", 1.0)]), "data.sources: names ['a', 'a'] repeat"),
    (dict(sources=[SourceConfig("web", "/d", 1.0, "float32")]), "data.sources[web].dtype: 'float32'"),
    (dict(on_exhausted="wrap"), "data.on_exhausted: 'wrap'; use repeat or stop"),
    (dict(kind="images"), "data.kind: 'images'; use chat or tokens"),
    (dict(val_sequences=-1), "data.val_sequences: -1"),
])
def test_bad_tokens_settings_are_one_line_each(change, message):
    problems = validate(tokens_cfg(**change))
    assert any(p.startswith(message) for p in problems), problems


def test_a_token_budget_is_whole_global_batches_rounded_up():
    cfg = Config()
    cfg.data.global_batch_size, cfg.data.seq_len = 8, 128
    assert train_steps(cfg) == cfg.train.max_steps
    cfg.train.max_tokens = 8 * 128 * 50
    assert train_steps(cfg) == 50
    cfg.train.max_tokens += 1
    assert train_steps(cfg) == 51
    tree = to_dict(Config())
    tree["train"]["max_tokens"], tree["optim"]["warmup_steps"] = 8 * 128 * 10, 20
    with pytest.raises(ConfigError, match=r"optim.warmup_steps: 20 must be below train.max_tokens=10240 \(10 steps\)"):
        to_config(tree, {"optim.warmup_steps"})


def test_the_data_preset_composes_with_the_sources_from_the_command_line(tmp_path):
    from resilient_slurm.data.tokens.prepare import compose

    cfg = compose(["data=tiny_pretrain", "data.sources=[{name:web,path:/data/tok/web,weight:0.7},"
                   "{name:code,path:/data/tok/code,weight:0.3}]"])
    assert cfg.data.kind == "tokens" and [(s.name, s.path, s.weight) for s in cfg.data.sources] == \
        [("web", "/data/tok/web", 0.7), ("code", "/data/tok/code", 0.3)]


def test_the_tiny_corpus_is_generated_tokenized_and_opened_on_a_fresh_cache(tmp_path):
    assert list(documents("math", 3, seed=0)) == list(documents("math", 3, seed=0))
    assert list(documents("prose", 5))[:3] == list(documents("prose", 3))
    prefixes = tiny_pretrain_prefixes(str(tmp_path))
    assert tiny_pretrain_prefixes(str(tmp_path)) == prefixes  # the second call finds it
    from resilient_slurm.data.tokens.prepare import compose

    cfg = compose(["data=tiny_pretrain", f"data.cache_dir={tmp_path}"])
    data = open_token_data(cfg)
    assert set(data.stats.tokens) == {"prose", "math"} and min(data.stats.tokens.values()) > 100_000
    batch = data.sampler(0, 1).next_batch()
    assert batch[0].input_ids.shape == (cfg.data.micro_batch_size, 128)
    assert data.val["math"].num_rows == cfg.data.val_sequences
