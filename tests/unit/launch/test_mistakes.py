"""A new user's mistakes at `python -m resilient_slurm.launch`: each gets exactly one line naming it
and the fix, and exit status 2, before torch is imported and before anything is written."""

import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.__main__ import main

REPO = Path(__file__).resolve().parents[3]
T = "+experiment=tiny_sft"
CE = "resilient_slurm: config error: "
E = "resilient_slurm: error: "
CHECKPOINTS = "every_200, every_50, every_500, exponential, hybrid, periodic, timed, young_daly"

MISTAKES = [
    # what is trained
    ([], E + "no experiment; choose one with +experiment=NAME: llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft (--help lists them with "
              "the keys)"),
    (["run.name=x"], E + "no experiment; choose one with +experiment=NAME: llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft (--help lists "
                         "them with the keys)"),
    (["experiment=tiny_sft"], CE + "experiment=tiny_sft: experiment has no default to override, so it takes a +; "
                                   "write +experiment=tiny_sft"),
    (["+experiment=tiny_sfft"], CE + "experiment: no experiment 'tiny_sfft' (did you mean tiny_sft?); choose one of "
                                     "llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft"),
    (["+experiment="], CE + "experiment: empty; choose one of llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft"),
    ([T, "+experiment=sft"], CE + "+experiment=sft: experiment is chosen twice; keep one"),
    (["+experiment=sft"], CE + "model.pretrained: +experiment=sft needs it; set model.pretrained=...\n"
                          + CE + "data.path: +experiment=sft needs it; set data.path=..."),
    (["+experiment=sft", "model.pretrained=/no/such/model", "data.path=/data/chat.jsonl"],
     CE + "model.pretrained: /no/such/model: no such directory; point model.pretrained at a Hugging Face model "
          "directory (config.json, safetensors weights, tokenizer files)"),
    # keys
    ([T, "optim.lrr=1e-3"], CE + "optim.lrr: not a config key; did you mean optim.lr?"),
    ([T, "+optim.lrr=1e-3"], CE + "optim.lrr: not a config key; did you mean optim.lr?"),
    ([T, "lr=1e-3"], CE + "lr: not a config key; did you mean optim.lr?"),
    ([T, "modle.hidden_size=64"], CE + "modle.hidden_size: not a config key; did you mean model.hidden_size?"),
    ([T, "~optim.lrr"], CE + "optim.lrr: not a config key; did you mean optim.lr?"),
    ([T, "foo=1"], CE + "foo: not a config key; python -m resilient_slurm.launch --help lists the keys"),
    ([T, "+foo=1"], CE + "foo: not a config key; python -m resilient_slurm.launch --help lists the keys"),
    ([T, "entry=own_loop.train:main", "steps=3"], CE + "steps: not a config key; write +steps=3 to add a key of your "
                                                      "own"),
    ([T, "cluster.sbatch_extra.qos=high"], CE + "cluster.sbatch_extra.qos: a new entry of cluster.sbatch_extra; write "
                                                "+cluster.sbatch_extra.qos=high"),
    ([T, "optim.lr=1e-3", "optim.lrr=1e-3", "train.max_stepz=3"],
     CE + "optim.lrr: not a config key; did you mean optim.lr?\n"
     + CE + "train.max_stepz: not a config key; did you mean train.max_steps?"),
    ([T, "optim=3"], CE + "optim: a section, not a value; set one of its keys (optim.KEY=VALUE)"),
    # the override grammar
    ([T, "optim.lr"], CE + "optim.lr: no value; write optim.lr=VALUE"),
    ([T, "optim.lr=("], CE + "optim.lr=(: not KEY=VALUE in Hydra's override grammar (extraneous input '('); fix it, "
                             "or quote the value"),
    # groups
    ([T, "checkpoint=exponentail"], CE + f"checkpoint: no option 'exponentail' (did you mean exponential?); choose one "
                                         f"of {CHECKPOINTS}"),
    ([T, "+checkpoint=exponential"], CE + "+checkpoint=exponential: checkpoint already has a default choice; write "
                                          "checkpoint=exponential"),
    ([T, "cluster=slurmm"], CE + "cluster: no option 'slurmm' (did you mean slurm?); choose one of local, slurm"),
    ([T, "model=llama_tinyy"], CE + "model: no option 'llama_tinyy' (did you mean llama_tiny?); choose one of "
                                    "llama_tiny"),
    # values
    ([T, "optim.lr=abc"], CE + "optim.lr: Value 'abc' of type 'str' could not be converted to Float; fix the value "
                               "or remove the key"),
    ([T, "train.max_steps=ten"], CE + "train.max_steps: Value 'ten' of type 'str' could not be converted to Integer; "
                                      "fix the value or remove the key"),
    ([T, "train.seed=1.5"], CE + "train.seed: Value '1.5' of type 'float' could not be converted to Integer; fix the "
                                 "value or remove the key"),
    ([T, "train.max_steps=0"], CE + "train.max_steps: 0; set it to 1 or more"),
    ([T, "data.global_batch_size=7"], CE + "data.global_batch_size: 7 is not a multiple of micro_batch_size*data-parallel "
                                           "ranks=4*1=4; change one of them"),
    ([T, "model.num_kv_heads=3"], CE + "model.num_kv_heads: 3 does not divide model.num_heads=4; pick a divisor"),
    ([T, "model.dtype=float16"], CE + "model.dtype: 'float16' unknown; use one of float32, bfloat16"),
    ([T, "data.seq_len=4096"], CE + "data.seq_len: 4096 exceeds model.max_seq_len=256; lower it or raise max_seq_len"),
    ([T, "checkpoint.keep_last=1"], CE + "checkpoint.keep_last: 1; keep at least 2 (the newest may be mid-save)"),
    ([T, "cluster.ranks=0"], CE + "cluster.ranks: 0; set it to 1 or more"),
    ([T, "tracking.mode=loud"], CE + "tracking.mode: 'loud' unknown; use one of offline, online, disabled"),
    ([T, "run.name=a/b"], CE + "run.name: 'a/b' is not a plain name; use letters, digits, '.', '_', '-'"),
    ([T, "optim.warmup_steps=400"], CE + "optim.warmup_steps: 400 must be below train.max_steps=300; lower it or "
                                         "raise train.max_steps"),
    (["-m", T, "optim.lr=1e-4,abc"], CE + "optim.lr: Value 'abc' of type 'str' could not be converted to Float; fix "
                                          "the value or remove the key"),
    # where the run lives
    ([T, "run.root="], CE + "run.root: empty; set it to the experiments directory"),
    ([T, "run.root=/sys/resilient_slurm_test"], CE + "run.root: cannot write to /sys/resilient_slurm_test (Operation "
                                                     "not permitted); set run.root to a directory you can write"),
    ([T, "run.root={file}/below"], CE + "run.root: cannot write to {file}/below (Not a directory); set run.root to a "
                                        "directory you can write"),
    # the command line itself
    ([T, "--cfg", "job"], E + "--cfg: not an option of launch; it takes -m, --config-dir DIR, --help and KEY=VALUE "
                              "overrides"),
    ([T, "--config-dir", "/no/such/dir"], E + "--config-dir /no/such/dir: no such directory; give the directory that "
                                              "holds your config groups"),
    ([T, "--help", "optm"], E + "--help optm: no such section or key; did you mean optim?"),
]


@pytest.mark.parametrize("argv, expected", MISTAKES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_mistake_is_one_line_naming_it_and_the_fix_and_exit_status_2(argv, expected, tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("")
    argv = [a.replace("{file}", str(file)) for a in argv]
    root = [] if any(a.startswith("run.root=") for a in argv) else [f"run.root={tmp_path / 'root'}"]
    code = main(argv + root)
    captured = capsys.readouterr()
    assert code == ExitCode.CONFIG
    assert captured.err == expected.replace("{file}", str(file)) + "\n"
    assert captured.out == ""
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("config.yaml"))


def test_there_are_at_least_thirty_of_them():
    assert len(MISTAKES) >= 30


def test_mistakes_come_before_torch_is_imported():
    """In a fresh interpreter, as a user runs it: three kinds of mistake, and torch never loaded."""
    code = ("import sys; from resilient_slurm.launch.__main__ import main; "
            "codes = [main(a) for a in (['+experiment=tiny_sft', 'optim.lrr=1'], ['experiment=tiny_sft'], "
            "['+experiment=tiny_sft', 'optim.lr=abc'], ['+experiment=sft', 'model.pretrained=/nope', 'data.path=x'])]; "
            "print([int(c) for c in codes], 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[2, 2, 2, 2] False", done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 4


def test_the_quick_start_trains_with_the_cpu_count_chosen_for_it():
    """`train.threads=0` (threads from the affinity mask and the node's ranks) is what +experiment=tiny_sft uses."""
    from resilient_slurm.config import to_config
    from resilient_slurm.config.composer import compose

    assert to_config(compose([T])).train.threads == 0


def test_the_readmes_checkpoint_override_changes_tiny_sfts_policy():
    """`+experiment=tiny_sft ... train.max_steps=500 checkpoint=exponential` saves at 100, 200, 400
    (and 500, the final save), not every 50 steps: the experiment's milestones are a checkpoint
    preset that a command-line choice replaces, like any group's."""
    from resilient_slurm.checkpoint.policy import step_reason
    from resilient_slurm.config import to_config
    from resilient_slurm.config.composer import compose

    def saves(*overrides):
        cfg = to_config(compose([T, *overrides]))
        return [s for s in range(1, cfg.train.max_steps + 1) if step_reason(s, cfg.checkpoint)], cfg.checkpoint

    steps, policy = saves("optim.lr=3e-4", "train.max_steps=500", "checkpoint=exponential")
    assert steps == [100, 200, 400] and policy.every_minutes == 0
    steps, policy = saves()
    assert steps == list(range(50, 301, 50)) and policy.every_minutes == 30  # tiny_sft's own: hybrid, every 50
    assert saves("checkpoint=exponential", "checkpoint.every_steps=150")[0] == [100, 150, 200, 300]
