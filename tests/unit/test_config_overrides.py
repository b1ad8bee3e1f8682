"""What Hydra itself says about a bad override, made one line: the errors are Hydra's own, raised by
composing without the checks that normally come first."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from resilient_slurm.config import register_schema
from resilient_slurm.config.composer import CONF_DIR, groups, schema
from resilient_slurm.config.overrides import check, hydra_problem, unknown_keys

register_schema()


def hydra_says(*overrides: str) -> str:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            compose("config", overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            return str(e)
    raise AssertionError(f"Hydra accepted {overrides}")


@pytest.mark.parametrize("overrides, line", [
    (["optim.lrr=1e-3"], "optim.lrr: not a config key; did you mean optim.lr?"),
    (["~optim.lrr"], "optim.lrr: not a config key; did you mean optim.lr?"),
    (["+experiment=tiny_sfft"], "experiment: no experiment 'tiny_sfft' (did you mean tiny_sft?); choose one of "
                                "llama70b_pretrain, llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft"),
    (["checkpoint=exponentail"], "checkpoint: no option 'exponentail' (did you mean exponential?); choose one of "
                                 "every_200, every_50, every_500, exponential, hybrid, periodic, timed, young_daly"),
    (["+experiment=tiny_sft", "+experiment=sft"], "experiment: chosen twice; keep one"),
    (["optim.lr=("], "optim.lr=(: not KEY=VALUE in Hydra's override grammar (extraneous input '('); fix it, or "
                     "quote the value"),
    (["cluster.sbatch_extra.x=1"], "cluster.sbatch_extra.x: a new entry; write +cluster.sbatch_extra.x=VALUE"),
])
def test_hydras_own_errors_become_one_line(overrides, line):
    message = hydra_says(*overrides)
    assert "\n" in message or len(message) > len(line)  # Hydra's text is not already the line
    assert hydra_problem(message, schema(), groups()) == line


def test_the_schema_knows_sections_values_and_the_dicts_below_which_keys_are_free():
    s = schema()
    assert {"optim.lr", "model.lora.rank", "cluster.elastic.min_nodes", "entry"} <= s.keys
    assert {"optim", "model.lora", "cluster.elastic"} <= s.sections
    assert s.knows("cluster.sbatch_extra.qos") and s.knows("user.anything") and not s.knows("optim.lr.x")
    assert unknown_keys({"optim": {"lr": 1, "lrr": 2}, "own": {"steps": 3}, "cluster": {"sbatch_extra": {"a": 1}}},
                        s) == ["optim.lrr", "own"]


def test_a_users_own_config_group_and_keys_pass_with_their_config_dir(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "default.yaml").write_text("steps: 10\n")
    g = groups([tmp_path])
    assert g.options["own"] == ("default",) and "own" not in g.chosen
    assert check(["+own=default", "own.steps=3", "entry=m:f"], schema(), g, entry=True) == []
    assert check(["own=default"], schema(), g, entry=True) == [
        "own=default: own has no default to override, so it takes a +; write +own=default"]


def test_a_group_of_ones_own_that_is_not_on_the_search_path_is_named_not_made_a_string():
    """`entry=... +own=default` without `--config-dir`: Hydra would make `own` the string "default"."""
    from pathlib import Path

    entry = "entry=own_loop.train:main"
    (line,) = check([entry, "+own=default"], schema(), groups(), entry=True)
    assert line.startswith("+own=default: no config group own/ on the search path") and "--config-dir" in line
    example = Path(CONF_DIR).parent / "examples" / "own_loop" / "conf"
    assert check([entry, "+own=default"], schema(), groups([example]), entry=True) == []
    assert check([entry, "+own='default'", "+scale=2", "+flag=true", "+own.lr=1e-3"], schema(), groups(),
                 entry=True) == []
