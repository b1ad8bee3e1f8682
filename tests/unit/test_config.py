from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from resilient_slurm.config import (
    Config,
    Layout,
    ConfigError,
    explicit_keys,
    flatten,
    layout,
    register_schema,
    to_config,
    to_dict,
    validate,
)
from resilient_slurm.model.pretrained import apply_pretrained
from tests.hf_model import make_hf_model

CONF = Path(__file__).resolve().parents[2] / "conf"
register_schema()


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("hf") / "small-llama")


@pytest.mark.parametrize("experiment", ["tiny_sft", "sft", "llama8b_sft"])
def test_experiments_compose_and_validate(experiment, pretrained):
    extra = [] if experiment == "tiny_sft" else [f"model.pretrained={pretrained}", "data.path=chat.jsonl"]
    cfg = to_config(composed(f"+experiment={experiment}", *extra), resolve_model=apply_pretrained)
    assert cfg.run.experiment == experiment


def test_the_pretraining_recipes_lay_out_their_clusters():
    seed = to_config(composed("+experiment=llama70b_pretrain", "data.tokenizer=/models/llama3",
                              "data.sources=[{name:web,path:/data/tok/web,weight:1}]"))
    assert (seed.cluster.kind, seed.cluster.nodes, seed.cluster.tasks_per_node) == ("slurm", 1250, 8)
    assert layout(seed) == Layout(dp_replicate=125, dp_shard=10, tp=8, pp=1)
    assert seed.data.global_batch_size * seed.data.seq_len == 20_480_000
    # --plan reads no data: without its location the recipe still composes for a plan, not for a run
    assert layout(to_config(composed("+experiment=llama70b_pretrain"), data_location=False)) == layout(seed)
    with pytest.raises(ConfigError, match=r"^data.tokenizer: \+experiment=llama70b_pretrain needs it"):
        to_config(composed("+experiment=llama70b_pretrain"))
    eight = to_config(composed("+experiment=llama8b_pretrain", "model.config=/models/llama3", "model.max_seq_len=8192",
                               "data.sources=[{name:web,path:/data/tok/web,weight:1}]"), data_location=False)
    assert layout(eight) == Layout(dp_replicate=4, dp_shard=8, tp=1, pp=1)


@pytest.mark.parametrize("experiment", ["sft", "llama8b_sft"])
def test_the_real_recipes_refuse_to_start_without_a_model_and_data_naming_both(experiment):
    with pytest.raises(ConfigError) as err:
        to_config(composed(f"+experiment={experiment}"), resolve_model=apply_pretrained)
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["model.pretrained", "data.path"]
    assert all(f"+experiment={experiment} needs it" in line for line in lines)


def test_a_pretrained_directory_sets_every_dimension(pretrained):
    cfg = to_config(composed("+experiment=llama8b_sft", f"model.pretrained={pretrained}", "data.path=x.jsonl"),
                    resolve_model=apply_pretrained)
    m = cfg.model
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.vocab_size, m.max_seq_len) == (
        64, 2, 4, 2, 512, 4096)
    assert m.name == "small-llama" and m.dtype == "bfloat16" and m.activation_checkpointing


def test_another_architecture_is_refused_at_launch_by_name(pretrained, tmp_path):
    import json
    import shutil

    other = tmp_path / "phi3"
    shutil.copytree(pretrained, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["Phi3ForCausalLM"],
                                                   "model_type": "phi3"}))
    with pytest.raises(ConfigError, match=r"^model.pretrained: .*phi3 \(Phi3ForCausalLM\) is not supported"):
        to_config(composed("+experiment=sft", f"model.pretrained={other}", "data.path=x.jsonl"),
                  resolve_model=apply_pretrained)


def test_tiny_and_8b_are_the_sft_recipe_at_two_sizes():
    tiny = to_config(composed("+experiment=tiny_sft"))
    big = composed("+experiment=llama8b_sft")
    assert big.data.seq_len == 4096 and big.model.activation_checkpointing and big.model.dtype == "bfloat16"
    assert tiny.data.seq_len == 128 and not tiny.model.pretrained and tiny.data.path.startswith("asset:")
    assert tiny.optim.weight_decay == big.optim.weight_decay and tiny.train.seed == big.train.seed
    assert tiny.data.loss == big.data.loss == "assistant"


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
        ("data.val_samples=2.5", "data.val_samples"),
        ("data.val_samples=-1", "data.val_samples"),
        ("run.baseline=../x", "run.baseline"),
        ("checkpoint.memory.every_steps=-1", "checkpoint.memory.every_steps"),
        ("checkpoint.memory.keep_last=3", "checkpoint.memory.keep_last"),
        ("checkpoint.memory.dir=shm", "checkpoint.memory.dir"),
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


def test_every_problem_is_reported_at_once_one_line_each():
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", "optim.lr=abc", "cluster.ranks=0", "checkpoint.keep_last=1",
                           "model.dtype=float8"))
    lines = str(err.value).splitlines()
    assert sorted(line.split(":")[0] for line in lines) == ["checkpoint.keep_last", "cluster.ranks", "model.dtype",
                                                          "optim.lr"]
    assert all("; " in line for line in lines)  # each says what to do


def test_a_term_warning_signal_is_refused_because_it_could_never_requeue():
    with pytest.raises(ConfigError, match=r"^cluster.signal: TERM cannot be the time-limit warning.*use USR1 or USR2"):
        to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.signal=TERM"))


def test_a_preset_warmup_that_does_not_fit_a_short_run_is_shortened_and_said():
    overrides = ["+experiment=tiny_sft", "train.max_steps=20"]
    adjustments = []
    cfg = to_config(composed(*overrides), explicit_keys(overrides), adjustments)
    assert cfg.optim.warmup_steps == 2 and cfg.train.max_steps == 20
    (a,) = adjustments
    assert (a.key, a.old, a.new) == ("optim.warmup_steps", 20, 2) and "train.max_steps=20" in a.why
    # a warmup the user chose is theirs: refused, not changed
    chosen = overrides + ["optim.warmup_steps=20"]
    with pytest.raises(ConfigError, match="^optim.warmup_steps: 20 must be below train.max_steps=20"):
        to_config(composed(*chosen), explicit_keys(chosen), [])


def test_explicit_keys_of_overrides():
    assert explicit_keys(["+experiment=x", "optim.lr=1e-4", "++run.name=a", "~fault.ranks", "-m"]) == \
        {"experiment", "optim.lr", "run.name"}


def test_conf_holds_only_values_that_differ_from_the_dataclass_defaults():
    """A default written both in config.py and in YAML is a default in two places."""
    import yaml

    defaults = flatten(to_dict(Config()))
    for path in sorted(CONF.rglob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        body.pop("defaults", None)
        body.pop("hydra", None)
        group = path.parent.name
        if group == "experiment":
            continue  # experiments are presets on top of other presets; checked below
        prefix = "" if group == "conf" else f"{group}."
        for key, value in flatten(body).items():
            if f"{prefix}{key}" == "cluster.kind":
                continue
            assert defaults.get(f"{prefix}{key}", object()) != value, f"{path.name}: {prefix}{key} repeats its default"


def test_data_chat_takes_the_models_tokenizer():
    cfg = to_config(composed("+experiment=tiny_sft", "data=chat", "data.path=/data/chat.jsonl",
                             "data.tokenizer=asset:tiny_chat"))
    assert (cfg.data.task, cfg.data.path, cfg.data.loss, cfg.data.overlong, cfg.data.bad_lines) == (
        "chat", "/data/chat.jsonl", "assistant", "truncate", "error")
    with pytest.raises(ConfigError, match="^data.tokenizer: empty and model.pretrained is not set"):
        to_config(composed("+experiment=tiny_sft", "data=chat", "data.path=/data/chat.jsonl"))


@pytest.mark.parametrize("override, key", [
    ("data.loss=prompt", "data.loss"),
    ("data.overlong=wrap", "data.overlong"),
    ("data.bad_lines=ignore", "data.bad_lines"),
    ("data.path=", "data.path"),
])
def test_bad_chat_values_give_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", override))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


@pytest.mark.parametrize("override, key, fix", [
    ("model.lora.rank=0", "model.lora.rank", "null for a full fine-tune"),
    ("model.lora.rank=-8", "model.lora.rank", "rank of 1 or more"),
    ("model.lora.targets=[q_proj,qproj]", "model.lora.targets", "'qproj' matches no layer"),
    ("model.lora.targets=[]", "model.lora.targets", "use some of q_proj"),
    ("model.lora.alpha=0", "model.lora.alpha", "> 0"),
    ("model.lora.dropout=1.0", "model.lora.dropout", "[0, 1)"),
])
def test_bad_lora_values_give_one_line_naming_the_key_and_the_fix(override, key, fix):
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", "model.lora.rank=8", override))
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message and fix in message


def test_an_n_d_run_shrinks_only_to_node_counts_its_fixed_degrees_divide():
    # tp 2 inside nodes of 2 ranks: a lost node takes its whole TP group; dp_shard takes what is left.
    ok = to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=4", "cluster.tasks_per_node=2",
                            "cluster.elastic.min_nodes=2", "parallel.tp=2", "data.global_batch_size=12",
                            "data.micro_batch_size=1"))
    assert ok.parallel.tp == 2
    # 2 replicas x tp 2 need 4 ranks per replica pair: 3 nodes (6 ranks) cannot hold them.
    with pytest.raises(ConfigError, match=r"^cluster.elastic.min_nodes: at 3 node\(s\), which the run may shrink to, "
                                          r"parallel: dp_replicate\*tp\*pp = 2\*2\*1 = 4 does not divide the 6 "
                                          r"rank\(s\)"):
        to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=4", "cluster.tasks_per_node=2",
                           "cluster.elastic.min_nodes=2", "parallel.tp=2", "parallel.dp_replicate=2",
                           "data.global_batch_size=12", "data.micro_batch_size=1"))


def test_spare_nodes_and_elastic_shrinking():
    ok = to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=2", "cluster.spare_nodes=1",
                            "cluster.elastic.min_nodes=1", "data.global_batch_size=8", "data.micro_batch_size=2"))
    assert ok.cluster.spare_nodes == 1 and ok.cluster.elastic.min_nodes == 1
    # 12 rows divide 2 ranks x 2 rows at 3 nodes but not at 2: the run could not shrink to 2
    with pytest.raises(ConfigError, match=r"^cluster.elastic.min_nodes: data.global_batch_size=12 .* at 2 node\(s\)"):
        to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=3", "cluster.tasks_per_node=2",
                           "cluster.elastic.min_nodes=2", "data.global_batch_size=12", "data.micro_batch_size=2"))
    # pp 2 x tp 2 on 4-rank nodes: a shrink drops whole data-parallel groups, so every size resolves;
    # pp 3 does not divide the 8 ranks of two nodes.
    pp = ["+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=3", "cluster.tasks_per_node=4", "parallel.pp=2",
          "parallel.tp=2", "eval.task_samples=0", "data.global_batch_size=12", "data.micro_batch_size=1"]
    assert to_config(composed(*pp, "cluster.elastic.min_nodes=1")).parallel.pp == 2
    with pytest.raises(ConfigError, match=r"^cluster.elastic.min_nodes: at 2 node\(s\), which the run may shrink to, "
                                          r"parallel: dp_replicate\*tp\*pp = 1\*1\*3 = 3 does not divide the 8"):
        to_config(composed(*pp[:4], "parallel.pp=3", "eval.task_samples=0", "data.global_batch_size=12",
                           "data.micro_batch_size=1", "cluster.elastic.min_nodes=2"))
    with pytest.raises(ConfigError, match=r"^cluster.spare_nodes: spare nodes .* add cluster=slurm"):
        to_config(composed("+experiment=tiny_sft", "cluster.spare_nodes=1"))
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", "cluster=slurm", "cluster.nodes=2", "cluster.spare_nodes=-1",
                           "cluster.elastic.min_nodes=3"))
    assert [line.split(":")[0] for line in str(err.value).splitlines()] == ["cluster.spare_nodes",
                                                                           "cluster.elastic.min_nodes"]


@pytest.mark.parametrize("overrides, problem", [
    (["tracking.backend=neptune"], "tracking.backend: 'neptune' unknown; use one of wandb, mlflow, none"),
    (["tracking.uri=/srv/mlruns"], "tracking.uri: only tracking.backend=mlflow uses it; set tracking.backend=mlflow "
                                   "or remove tracking.uri"),
    (["tracking.backend=mlflow", "tracking.uri=mlruns"],
     "tracking.uri: 'mlruns' is a relative path; give an absolute path or a URI"),
    (["tracking.backend=mlflow", "tracking.uri='http://host:5000'"],
     "tracking.uri: http://host:5000 is a server, which tracking.mode=offline never sends to; set tracking.mode=online"),
    (["tracking.backend=mlflow", "tracking.mode=online"],
     "tracking.uri: tracking.mode=online sends to a server; set tracking.uri=http://HOST:PORT (or mode=offline)"),
    (["tracking.backend=mlflow"], None),
    (["tracking.backend=mlflow", "tracking.uri='sqlite:////srv/mlflow.db'"], None),
    (["tracking.backend=mlflow", "tracking.mode=online", "tracking.uri='https://host'"], None),
    (["tracking.backend=none"], None),
])
def test_tracking_backend_and_uri(overrides, problem):
    if problem is None:
        assert to_config(composed("+experiment=tiny_sft", *overrides)).tracking.backend == overrides[0].split("=")[1]
        return
    with pytest.raises(ConfigError) as err:
        to_config(composed("+experiment=tiny_sft", *overrides))
    assert str(err.value) == problem


def test_mixture_weights_that_do_not_sum_to_1_are_normalised_and_said():
    """Issue 27, item 11: 0.7 + 0.7 trained half and half without a word. The decision: weights are
    relative, and the run's first log line (the data summary) says the shares and the normalising."""
    from resilient_slurm.config import SourceConfig

    cfg = Config()
    cfg.data.sources = [SourceConfig("web", "/x", 0.7), SourceConfig("code", "/y", 0.7)]
    assert cfg.data.mixture() == "web 50%, code 50% (weights 0.7 + 0.7 = 1.4, normalised to shares of 1)"
    cfg.data.sources = [SourceConfig("prose", "/x", 0.7), SourceConfig("math", "/y", 0.3)]
    assert cfg.data.mixture() == "prose 70%, math 30%"
