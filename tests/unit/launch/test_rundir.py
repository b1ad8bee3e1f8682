from datetime import date

import pytest

from resilient_slurm.config import Config, ConfigError
from resilient_slurm.launch.prepare import AllowedChange, prepare
from resilient_slurm.rundir.identity import config_hash, load_config
from resilient_slurm.rundir.meta import read_meta
from resilient_slurm.launch.naming import run_name, variant


def trained(path):
    """What the checkpointer leaves once a run has committed its first checkpoint: a `save` event."""
    from resilient_slurm.ledger import EventLog, Save

    EventLog(path / "events.jsonl", rank=0).emit(Save(reason="periodic", mode="sync", path=str(path / "checkpoints"),
                                                      bytes=1, seconds=0.1, blocking_s=0.1, has_optimizer=True), 10)
    return path


def cfg(tmp_path, **optim):
    c = Config()
    c.run.root = str(tmp_path)
    c.run.experiment = "exp"
    for k, v in optim.items():
        setattr(c.optim, k, v)
    return c


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "base"),
        (["+experiment=tiny_sft"], "base"),
        (["optim.lr=1e-4"], "lr1e-4"),
        (["optim.lr=1e-4", "data.global_batch_size=32"], "lr1e-4-bs32"),
        (["data.seq_len=4096", "run.root=/x", "cluster.ranks=2", "checkpoint.every_steps=5"], "seq4096"),
        (["data.micro_batch_size=1", "data.global_batch_size=32"], "bs32"),  # how rows are cut is placement
        (["model=llama3_8b"], "base"),
        (["optim.beta2=0.99"], "beta20.99"),
        (["optim.lr=0.0001"], "lr1e-4"),
        (["optim.lr=3.0e-4"], "lr3e-4"),
        (["optim.lr=2.5e-05"], "lr2.5e-5"),
        (["optim.weight_decay=0.10"], "wd0.1"),
    ],
)
def test_variant_from_overrides(overrides, expected):
    assert variant(overrides) == expected


def test_run_name_shape():
    assert run_name(Config(), ["optim.lr=3e-4"], date(2026, 1, 2)) == "llama-tiny-tiny-chat-20260102-lr3e-4"


def test_first_launch_creates_the_layout_and_relaunch_resumes(tmp_path):
    c = cfg(tmp_path)
    path, resumed = prepare(c, ["optim.lr=1e-4"], date(2026, 1, 2))
    assert not resumed and path == tmp_path / "exp" / "llama-tiny-tiny-chat-20260102-lr1e-4"
    assert {p.name for p in path.iterdir()} >= {"config.yaml", "checkpoints", "logs", "run.json", "overrides.yaml"}
    again, resumed = prepare(cfg(tmp_path), ["optim.lr=1e-4"], date(2026, 1, 2))
    assert again == path and resumed
    assert load_config(path).run.name == path.name


def test_relaunch_with_a_different_learning_rate_is_refused_naming_the_key(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    trained(prepare(first, [])[0])
    changed = cfg(tmp_path, lr=3e-4)
    changed.run.name = "r"
    with pytest.raises(ConfigError, match=r"optim\.lr \(0\.0001 -> 0\.0003\)"):
        prepare(changed, [])


def test_relaunch_may_change_placement_keys(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    path, _ = prepare(first, [])
    moved = cfg(tmp_path)
    moved.run.name = "r"
    moved.cluster.ranks = 2
    moved.checkpoint.every_steps = 7
    moved.data.micro_batch_size = 1  # the same global batch in smaller pieces (an OOM's remedy)
    _, resumed = prepare(moved, [])
    assert resumed and load_config(path).cluster.ranks == 2
    assert config_hash(first) == config_hash(moved)


def test_refusal_is_one_line_that_offers_a_fork(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    trained(prepare(first, [])[0])
    changed = cfg(tmp_path, lr=3e-4, weight_decay=0.0)
    changed.run.name = "r"
    with pytest.raises(ConfigError) as err:
        prepare(changed, [])
    message = str(err.value)
    assert "\n" not in message and "optim.lr" in message and "optim.weight_decay" in message
    assert "run.fork=true" in message


def test_fork_makes_a_new_run_that_names_its_parent_and_resumes_on_relaunch(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    parent = trained(prepare(first, [])[0])

    def fork(lr):
        c = cfg(tmp_path, lr=lr)
        c.run.name, c.run.fork = "r", True
        return prepare(c, ["optim.lr=" + str(lr), "run.fork=true"])

    path, resumed = fork(3e-4)
    assert path == parent.with_name("r-fork1") and not resumed
    trained(path)
    meta = read_meta(path)
    assert meta["parent"] == {"name": "r", "run_id": read_meta(parent)["run_id"], "changed": ["optim.lr"]}
    assert meta["run_id"] != meta["parent"]["run_id"] and load_config(path).run.name == "r-fork1"
    assert fork(3e-4) == (path, True)  # the same fork command resumes the fork
    assert fork(1e-3)[0] == parent.with_name("r-fork2")
    same = cfg(tmp_path)
    same.run.name, same.run.fork = "r", True
    assert prepare(same, []) == (parent, True)  # nothing changed: no fork


def test_an_ablation_records_its_group_from_the_baseline(tmp_path):
    base = cfg(tmp_path)
    base.run.name = "base"
    prepare(base, [])
    abl = cfg(tmp_path, lr=3e-4)
    abl.run.name, abl.run.baseline = "lr3e-4", "base"
    path, _ = prepare(abl, [])
    assert read_meta(path)["ablation"] == {"baseline": "base", "group": "ablation-lr-1e-4-vs-3e-4",
                                                 "changed": ["optim.lr"]}
    missing = cfg(tmp_path)
    missing.run.name, missing.run.baseline = "x", "nope"
    with pytest.raises(ConfigError, match=r"^run\.baseline: no run .*nope; launch the baseline first"):
        prepare(missing, [])


def test_every_launch_is_recorded_with_its_overrides(tmp_path):
    from resilient_slurm.rundir.record import read_record

    c = cfg(tmp_path)
    c.run.name = "r"
    path, _ = prepare(c, ["run.name=r"])
    again = cfg(tmp_path)
    again.run.name, again.cluster.ranks = "r", 2
    prepare(again, ["run.name=r", "cluster.ranks=2"])
    lines = read_record(path)
    assert [(x["kind"], x["resumed"], x["overrides"]) for x in lines] == [
        ("launch", False, ["run.name=r"]), ("launch", True, ["run.name=r", "cluster.ranks=2"])]


def test_an_allowed_change_is_made_and_recorded_in_run_json_and_the_ledger(tmp_path):
    from resilient_slurm.ledger import ConfigChanged, read_events, select

    first = cfg(tmp_path)
    first.run.name = "r"
    path = trained(prepare(first, [])[0])
    old_hash = read_meta(path)["config_hash"]
    changed = cfg(tmp_path, lr=3e-4)
    changed.run.name = "r"
    allow = AllowedChange(frozenset({"optim.lr", "optim.warmup_steps"}), "PBT generation 1")
    _, resumed = prepare(changed, [], allow=allow)
    meta = read_meta(path)
    assert resumed and load_config(path).optim.lr == 3e-4
    assert meta["config_hash"] == config_hash(changed) != old_hash
    (change,) = meta["changes"]
    assert change["changed"] == {"optim.lr": [1e-4, 3e-4]} and change["previous_config_hash"] == old_hash
    (event,) = select(read_events(path / "events.jsonl"), ConfigChanged)
    assert event.details.changed == {"optim.lr": [1e-4, 3e-4]} and event.details.reason == "PBT generation 1"


def test_a_change_beyond_the_allowed_keys_is_refused_as_ever(tmp_path):
    first = cfg(tmp_path)
    first.run.name = "r"
    trained(prepare(first, [])[0])
    changed = cfg(tmp_path, lr=3e-4, weight_decay=0.0)
    changed.run.name = "r"
    with pytest.raises(ConfigError, match=r"optim\.weight_decay"):
        prepare(changed, [], allow=AllowedChange(frozenset({"optim.lr"}), "x"))
    assert "changes" not in read_meta(tmp_path / "exp" / "r")


def test_before_its_first_checkpoint_a_relaunch_may_change_anything_and_the_change_is_recorded(tmp_path):
    """A run whose data check failed (nothing trained) is relaunched with the data fixed: no refusal,
    the change in run.json and the ledger, the old data fingerprint dropped."""
    from resilient_slurm.ledger import ConfigChanged, read_events, select

    first = cfg(tmp_path)
    first.run.name = "r"
    first.data.path = "/data/typo.jsonl"
    path, _ = prepare(first, [])
    (path / "data.json").write_text('{"digest": "old"}')
    old_hash = read_meta(path)["config_hash"]
    fixed = cfg(tmp_path, lr=3e-4)
    fixed.run.name = "r"
    fixed.data.path = "/data/chat.jsonl"
    again, resumed = prepare(fixed, [])
    assert again == path and resumed and load_config(path).data.path == "/data/chat.jsonl"
    (change,) = read_meta(path)["changes"]
    assert change["changed"] == {"data.path": ["/data/typo.jsonl", "/data/chat.jsonl"], "optim.lr": [1e-4, 3e-4]}
    assert change["previous_config_hash"] == old_hash and read_meta(path)["config_hash"] == config_hash(fixed)
    assert change["reason"].startswith("not trained yet (no checkpoint)")
    (event,) = select(read_events(path / "events.jsonl"), ConfigChanged)
    assert event.details.changed == change["changed"]
    assert not (path / "data.json").exists()
    trained(path)
    with pytest.raises(ConfigError, match=r"optim\.lr \(0\.0003 -> 0\.001\)"):
        _relaunch(tmp_path, lr=1e-3)  # trained now: frozen


def _relaunch(tmp_path, **optim):
    c = cfg(tmp_path, **optim)
    c.run.name = "r"
    c.data.path = "/data/chat.jsonl"
    return prepare(c, [])


def test_a_finished_run_is_found_before_anything_is_written(tmp_path):
    from resilient_slurm.launch.prepare import finished
    from resilient_slurm.ledger import EventLog, Finish

    c = cfg(tmp_path)
    c.run.name = "r"
    assert finished(c, []) is None  # no such run yet
    path, _ = prepare(c, [])
    assert finished(c, []) is None  # started, not finished
    EventLog(path / "events.jsonl", rank=0).emit(Finish(tokens_seen=10), 300)
    again = cfg(tmp_path)
    again.run.name, again.cluster.ranks = "r", 2  # where it runs does not matter
    assert finished(again, []) == path
    other = cfg(tmp_path, lr=3e-4)
    other.run.name = "r"
    assert finished(other, []) is None  # a changed config is for prepare to refuse or fork


@pytest.mark.parametrize("root, reason", [("/sys/resilient_slurm_test", "Operation not permitted"),
                                          ("{file}/below", "Not a directory")])
def test_an_experiments_root_that_cannot_be_written_is_one_line(tmp_path, root, reason):
    (tmp_path / "file").write_text("")
    c = cfg(tmp_path)
    c.run.root = root.format(file=tmp_path / "file")
    with pytest.raises(ConfigError) as err:
        prepare(c, [])
    assert str(err.value) == (f"run.root: cannot write to {c.run.root} ({reason}); set run.root to a directory you "
                              f"can write")
