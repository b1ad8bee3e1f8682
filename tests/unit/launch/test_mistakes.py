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
    ([], E + "no experiment; choose one with +experiment=NAME: llama70b_pretrain, llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft (--help lists them with "
              "the keys)"),
    (["run.name=x"], E + "no experiment; choose one with +experiment=NAME: llama70b_pretrain, llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft (--help lists "
                         "them with the keys)"),
    (["experiment=tiny_sft"], CE + "experiment=tiny_sft: experiment has no default to override, so it takes a +; "
                                   "write +experiment=tiny_sft"),
    (["+experiment=tiny_sfft"], CE + "experiment: no experiment 'tiny_sfft' (did you mean tiny_sft?); choose one of "
                                     "llama70b_pretrain, llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft"),
    (["+experiment="], CE + "experiment: empty; choose one of llama70b_pretrain, llama8b_pretrain, llama8b_sft, pretrain, sft, tiny_pretrain, tiny_sft"),
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
    (["entry=own_loop.train:main", "+own=default"], CE + "+own=default: no config group own/ on the search path, so "
                                                         "own would be the string 'default'; pass --config-dir DIR "
                                                         "with own/default.yaml in it, or quote the value "
                                                         "(+own='default') if you mean the string"),
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
    ([T, "monitor.sdc.every_steps=0"], CE + "monitor.sdc.every_steps: 0; set it to 1 or more (monitor.sdc.enabled=false "
                                            "turns the comparison off)"),
    ([T, "monitor.sdc.rerun_every_steps=10"], CE + "monitor.sdc.rerun_every_steps: 10 on one rank: a buddy re-runs the "
                                                   "update on another rank; run 2 or more ranks, or set it to 0"),
    ([T, "cluster.ranks=2", "parallel.dp_replicate=2", "monitor.sdc.rerun_every_steps=10"],
     CE + "monitor.sdc.rerun_every_steps: 10 with parallel.dp_replicate=2: the replicas are compared every "
          "monitor.sdc.every_steps already; set it to 0"),
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
    # pipeline parallelism
    ([T, "cluster.ranks=2", "parallel.pp=2", "model.num_layers=1", "eval.task_samples=0"],
     CE + "parallel.pp: 2 pipeline stage(s) for 1 layer(s); every stage needs a layer: lower parallel.pp"),
    ([T, "cluster.ranks=4", "parallel.pp=2", "data.micro_batch_size=4", "eval.task_samples=0"],
     CE + "parallel.pp: 2 stages need at least 2 micro-batches per step, and a step has 1 (global_batch_size / "
          "(micro_batch_size * 2 data-parallel ranks)); raise data.global_batch_size or lower data.micro_batch_size"),
    ([T, "cluster.ranks=2", "parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "data.global_batch_size=10",
      "data.micro_batch_size=2", "eval.task_samples=0"],
     CE + "parallel.pp_schedule: interleaved_1f1b runs the 5 micro-batches of a step in 2 rounds (micro-batches // "
          "pp), which must divide them; make the micro-batches per step a multiple of 2 (data.global_batch_size / "
          "(data.micro_batch_size * data-parallel ranks)), or use parallel.pp_schedule=1f1b"),
    ([T, "cluster.ranks=2", "parallel.pp=2"],
     CE + "eval.task_samples: 64 with parallel.pp=2; greedy decoding through a pipeline (each new token back from "
          "the last stage to the first) is not built, only the validation loss is; set eval.task_samples=0, or "
          "parallel.pp=1"),
    (["-m", T, "optim.lr=1e-4,abc"], CE + "optim.lr: Value 'abc' of type 'str' could not be converted to Float; fix "
                                          "the value or remove the key"),
    # the layout
    ([T, "cluster.ranks=4", "parallel.dp_shard=3"],
     CE + "parallel: dp_replicate*dp_shard*tp*pp = 1*3*1*1 = 3, but the run has 4 rank(s); make the product equal "
          "the ranks, or set parallel.dp_shard=-1"),
    ([T, "cluster.ranks=4", "parallel.dp_replicate=3"],
     CE + "parallel: dp_replicate*tp*pp = 3*1*1 = 3 does not divide the 4 rank(s); change a degree or the number of "
          "ranks"),
    ([T, "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "parallel.tp=4"],
     CE + "parallel.tp: 4 does not fit inside a node of 2 rank(s): tensor parallelism exchanges activations every "
          "layer and must stay on a node's links; use a tp that divides 2"),
    ([T, "cluster.ranks=3", "parallel.tp=3"],
     CE + "parallel.tp: 3 does not divide the model's 4 attention heads and 2 key/value heads; use a tp that divides "
          "both (at most 2)"),
    ([T, "cluster.ranks=4", "parallel.tp=4"],
     CE + "parallel.tp: 4 does not divide the model's 4 attention heads and 2 key/value heads; use a tp that divides "
          "both (at most 2)"),
    # replica groups (cluster.replica_ft)
    ([T, "cluster.replica_ft=true"], CE + "cluster.replica_ft: needs parallel.dp_replicate >= 2 (replica groups to fail "
                                          "over between), and it is 1; set parallel.dp_replicate=2 or more, or "
                                          "cluster.replica_ft=false"),
    ([T, "cluster.replica_ft=true", "cluster.ranks=2", "parallel.dp_replicate=2", "cluster.replica_min=3"],
     CE + "cluster.replica_min: 3 is above parallel.dp_replicate=2, so no quorum could ever form; set it between 1 "
          "and 2"),
    ([T, "cluster.spare_topup=2"],
     CE + "cluster.spare_topup: only a replica group can start on the nodes of another Slurm job; set cluster=slurm "
          "cluster.replica_ft=true, or cluster.spare_topup=0"),
    ([T, "cluster.spare_topup=-1"], CE + "cluster.spare_topup: -1; set it >= 0 (0 turns it off)"),
    ([T, "cluster.spare_topup_at=-1"], CE + "cluster.spare_topup_at: -1; set it >= 0 (0 asks once no spare is left)"),
    ([T, "cluster.spare_topup_at=2"],
     CE + "cluster.spare_topup_at: 2 without top-ups; set cluster.spare_topup to the nodes to ask for, or "
          "cluster.spare_topup_at=0"),
    ([T, "cluster.replica_ft=true", "cluster.ranks=4", "parallel.dp_replicate=2", "parallel.pp=2", "eval.task_samples=0",
      "data.micro_batch_size=1"],
     CE + "cluster.replica_ft: not with pipeline parallelism yet (parallel.pp=2); set parallel.pp=1 or "
          "cluster.replica_ft=false"),
    ([T, "cluster.replica_ft=true", "cluster.ranks=2", "parallel.dp_replicate=2", "+no_torchft=1"],
     CE + "cluster.replica_ft: replica groups need torchft, which is not installed; pip install "
          "'resilient-slurm[replica]', or set cluster.replica_ft=false"),
    # where the run lives
    ([T, "run.root="], CE + "run.root: empty; set it to the experiments directory"),
    ([T, "run.root=/sys/resilient_slurm_test"], CE + "run.root: cannot write to /sys/resilient_slurm_test (Operation "
                                                     "not permitted); set run.root to a directory you can write"),
    ([T, "run.root={file}/below"], CE + "run.root: cannot write to {file}/below (Not a directory); set run.root to a "
                                        "directory you can write"),
    # issue 27, items 10-12: a benchmark's extra, a silent reading, Hydra's own words
    ([T, "eval.harness.tasks=[tiny_mmlu]", "eval.harness.every_steps=100"],
     CE + "eval.harness.tasks: benchmarks (tiny_mmlu) need lm-eval, which is not installed; pip install "
          "'resilient-slurm[eval]', or leave eval.harness.tasks empty"),
    ([T, "data.val_samples=2.0"], CE + "data.val_samples: 2.0 is ambiguous; write 2 to hold out 2 conversations, or a "
                                       "share below 1 (0.05 for 5%)"),
    ([T, "train.max_steps=-5"], CE + "train.max_steps: -5; set it to 1 or more"),
    (["--config-dir", "{own}", "entry=own_loop.train:main", "+own=default", "own.lrr=1e-3"],
     CE + "own.lrr: not a key of own (did you mean own.lr?); write +own.lrr=VALUE to add a key of your own"),
    ([T, "+train.max_steps=5"], CE + "+train.max_steps=5: train.max_steps is a key of the config already; drop the + "
                                     "(write train.max_steps=5)"),
    (["++experiment=tiny_sft"], CE + "++experiment=tiny_sft: a config group takes one + at most; write "
                                     "+experiment=tiny_sft"),
    ([T, "+++optim.lr=1"], CE + "+++optim.lr=1: too many + or ~; write KEY=VALUE to set a key, +KEY=VALUE to add one "
                                "of your own, ~KEY to remove one"),
    # `data.sources=[{name:web,path:/x,weight:1}]` unquoted: bash's brace expansion makes three arguments
    (["+experiment=tiny_pretrain", "data.sources=[name:web]", "data.sources=[path:/x]", "data.sources=[weight:1]"],
     CE + "data.sources=[name:web]: the shell took this value's braces apart (brace expansion); quote the whole "
          "override: 'data.sources=[{name:web,path:/data/tok/web,weight:0.7},...]'"),
    # the command line itself
    ([T, "--cfg", "job"], E + "--cfg: not an option of launch; it takes -m, --config-dir DIR, --plan, --help and "
                              "KEY=VALUE overrides"),
    ([T, "--config-dir", "/no/such/dir"], E + "--config-dir /no/such/dir: no such directory; give the directory that "
                                              "holds your config groups"),
    ([T, "--help", "optm"], E + "--help optm: no such section or key; did you mean optim?"),
]


@pytest.mark.parametrize("argv, expected", MISTAKES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_mistake_is_one_line_naming_it_and_the_fix_and_exit_status_2(argv, expected, tmp_path, capsys,
                                                                          monkeypatch):
    file = tmp_path / "file"
    file.write_text("")
    if any(a.startswith("eval.harness.tasks=") for a in argv):
        monkeypatch.setitem(sys.modules, "lm_eval", None)  # lm-eval made unimportable, as if not installed
    if "+no_torchft=1" in argv:  # torchft made unimportable likewise; the marker is not an override
        monkeypatch.setitem(sys.modules, "torchft", None)
        argv = [a for a in argv if a != "+no_torchft=1"]
    argv = [a.replace("{file}", str(file)).replace("{own}", str(REPO / "examples" / "own_loop" / "conf")) for a in argv]
    root = [] if any(a.startswith("run.root=") for a in argv) else [f"run.root={tmp_path / 'root'}"]
    code = main(argv + root)
    captured = capsys.readouterr()
    assert code == ExitCode.CONFIG
    assert captured.err == expected.replace("{file}", str(file)) + "\n"
    assert captured.out == ""
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("config.yaml"))


def test_there_are_at_least_thirty_of_them():
    assert len(MISTAKES) >= 30


# Issue 27's items 11-13 beyond launch: each command's one line (stdout or stderr) and exit status.
# {dir} is an empty directory: no checkpoint, no tokenizer.
OTHER_COMMANDS = [
    ([str(REPO / "tools" / "xid_scan"), "exclude", "list", "--file", "{dir}/exclude.json"], 2, "err",
     "xid_scan exclude: {dir}/exclude.json: no such file; give the exclude list's path (cluster.exclude_file; "
     "`xid_scan exclude add` creates it)"),
    ([sys.executable, "-m", "resilient_slurm.checkpoint", "verify", "{dir}"], 2, "out",
     "not a checkpoint: {dir}: no manifest.json and no model*.safetensors in it; give a checkpoint directory (a run's "
     "checkpoints/step_NNNNNNNN), or the run directory to list them"),
    ([sys.executable, "-m", "resilient_slurm.data", "tokenize", "--input", "{dir}/in.jsonl", "--output-prefix",
      "{dir}/tok", "--tokenizer", "{dir}"], 2, "err",
     "resilient_slurm: tokenize: --tokenizer {dir}: no tokenizer.json there; give a Hugging Face model directory that "
     "has tokenizer.json"),
]


@pytest.mark.parametrize("argv, status, stream, expected", OTHER_COMMANDS, ids=lambda v: v[2] if isinstance(v, list) else None)
def test_the_other_commands_mistakes_are_one_line_each(argv, status, stream, expected, tmp_path):
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == status, done.stdout + done.stderr
    assert (done.stdout if stream == "out" else done.stderr) == expected.replace("{dir}", str(tmp_path)) + "\n"


def test_evaluate_without_lm_eval_is_one_line(tmp_path):
    """lm-eval made unimportable (a None in sys.modules, as if not installed) in the fresh interpreter
    that runs `python -m resilient_slurm.evaluate`: one line, exit 2, not two tracebacks."""
    code = ("import sys; sys.modules['lm_eval'] = None\n"
            "from resilient_slurm.evaluate.__main__ import main\n"
            f"sys.exit(main([{str(tmp_path)!r}, '--step', '50', '--tasks', 'tiny_mmlu']))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "evaluate: lm-eval is not installed; pip install 'resilient-slurm[eval]'\n"


@pytest.mark.parametrize("argv, whole", [
    (["resilient_slurm.data", "--help"], "Exit status: 0 done; 2 bad input or arguments, one line naming the file or "
                                         "key and the fix."),
    (["resilient_slurm.data", "prepare", "--help"], "Prints one line per source"),
    (["resilient_slurm.export", "--help"], "Exit status: 0 written, 1 the checkpoint or the export failed, 2 usage."),
    (["resilient_slurm.evaluate", "--help"], "Exit status: 0 scored, 1 the evaluation failed (twice), 2 usage or "
                                             "lm-eval not installed."),
    (["resilient_slurm.sweep", "--help"], "sweep.poll_s=10.0"),
])
def test_help_exits_0_and_is_whole(argv, whole):
    """Issue 27, item 13: `data --help` exited 2; export's and evaluate's stopped mid-sentence (the
    first line of their docstring); prepare's and sweep's were too thin to use."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert whole in done.stdout, done.stdout


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
