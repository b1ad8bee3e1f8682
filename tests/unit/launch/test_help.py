"""`launch --help`: the experiments, the groups and the main keys with the doc strings written under
the dataclass fields (read from the source, so the help needs neither OmegaConf nor torch)."""

import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

from resilient_slurm.config import Config
from resilient_slurm.config.overrides import Schema
from resilient_slurm.launch import help
from resilient_slurm.launch.__main__ import main

REPO = Path(__file__).resolve().parents[3]


def test_the_overview_lists_the_experiments_the_groups_and_the_main_keys_with_their_docs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for experiment in ("tiny_sft", "sft", "llama8b_sft"):
        assert f"\n  {experiment} " in out
    assert "The sft recipe scaled to a CPU, with nothing to download" in out  # tiny_sft's own comment
    assert "\n  checkpoint  every_200, every_50, every_500, exponential, hybrid*, periodic" in out
    assert "\n  cluster     local*, slurm\n" in out
    for key in help.MAIN_KEYS:
        assert f"\n  {key}=" in out, key
    assert "optim.lr=0.0001  (float)" in out and "Peak learning rate of AdamW" in out
    assert "train.threads=0  (int)" in out and "torch intra-op threads per rank" in out


def test_a_section_lists_every_key_with_its_whole_doc(capsys):
    assert main(["--help", "model.lora"]) == 0
    out = capsys.readouterr().out
    assert [line.split("=")[0].strip() for line in out.splitlines() if line.startswith("  model.")] == [
        "model.lora.rank", "model.lora.alpha", "model.lora.dropout", "model.lora.targets"]
    assert "writes the merged model)." in " ".join(out.split())  # the last words of rank's doc, not its first sentence


def test_the_source_reader_finds_every_key_of_the_schema_and_its_default():
    keys = help.keys()
    assert set(keys) == Schema.of(Config()).keys

    def defaults(obj, prefix=""):
        for f in fields(obj):
            value = getattr(obj, f.name)
            if is_dataclass(value):
                yield from defaults(value, f"{prefix}{f.name}.")
            else:
                yield prefix + f.name, value

    for key, value in defaults(Config()):
        if isinstance(value, bool):
            assert keys[key].default == str(value).lower(), key
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert eval(keys[key].default) == value, key  # noqa: S307 - our own source's literals (1 << 30)
        elif isinstance(value, str):
            assert keys[key].default == (value or "''"), key


def test_the_help_imports_neither_omegaconf_nor_torch():
    code = ("import sys, io, contextlib; from resilient_slurm.launch.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): code = main(['--help'])\n"
            "print(code, 'omegaconf' in sys.modules, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0 False False", done.stderr


def test_the_command_line_options():
    from resilient_slurm.launch.command import Command, UsageError, parse

    assert parse(["--help"]).help == "" and parse(["-h", "checkpoint"]).help == "checkpoint"
    assert parse(["--help", "+experiment=tiny_sft"]).help == ""  # an override is not a topic
    assert parse(["-m", "+experiment=tiny_sft", "optim.lr=1,2"]) == Command(("+experiment=tiny_sft", "optim.lr=1,2"),
                                                                            multirun=True)
    assert parse(["--config-dir", "a", "-cd=b", "entry=m:f"]).config_dirs == (Path("a"), Path("b"))
    assert parse(["+experiment=x", "--plan"]).plan and not parse(["+experiment=x"]).plan
    assert parse(["run.name=x"]).bare and not parse(["entry=m:f"]).bare and not parse(["+experiment=x"]).bare
    for bad, line in ((["--config-dir"], "--config-dir: no directory; write --config-dir DIR"),
                      (["--multi"], "--multi: not an option of launch; it takes -m, --config-dir DIR, --plan, --help "
                                    "and KEY=VALUE overrides")):
        try:
            parse(bad)
        except UsageError as e:
            assert str(e) == line
        else:
            raise AssertionError(bad)
