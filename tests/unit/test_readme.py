"""Every command the README shows is run somewhere: by a test (named here, and checked to exist), by
`bench/quickstart.py`, or by CI itself. A command added to the README without a test that runs it
fails here until it is given one. The launch, sweep and prepare commands are also composed and
validated here, exactly as the command does before it runs anything, so that none of them has a
misspelt key or a value the config refuses, even those that need a cluster of GPUs to run for real
(marked COMPOSED: composing them is all this machine can do). Every file path the README names
exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from resilient_slurm.config import explicit_keys, to_config
from resilient_slurm.config.composer import check_overrides, compose, sweep_points
from resilient_slurm.launch import command

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PROGRAMS = ("python ", "pip ", "tools/", "sbatch ", "wandb ", "MLFLOW_", "export ")
COMPOSED = "COMPOSED"
"""Needs what this machine has not (a GPU cluster, model weights): composed and validated here."""
NOT_HERE = "NOT_HERE"
"""Talks to a service no test can reach (a wandb server, MLflow's web UI, which only the full `mlflow`
package serves); the test named beside it in NOT_HERE_CHECKED checks what the command is given."""
NOT_HERE_CHECKED = {
    "wandb sync": "tests/unit/analysis/test_goodput.py::test_summary_matches_the_golden_file (the report prints it)",
    "mlflow ui": "tests/integration/test_mlflow_lineage.py (MlflowClient reads the same store)",
}

# (a regular expression a README command matches from its start, where it runs)
RUN_BY: list[tuple[str, str]] = [
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft cluster\.ranks=2 parallel\.dp_replicate=2 "
     r"cluster\.replica_ft=true",
     "tests/integration/test_replica_groups.py::test_a_killed_group_is_replaced_from_the_live_one_and_the_run_matches_"
     "its_twin"),
    (r"pip install torch==2\.13\.0 && pip install -e \. && python -m resilient_slurm\.launch \+experiment=tiny_sft$",
     "tests/integration/test_fresh_install.py::test_a_fresh_venv_installs_the_project_and_runs_the_quick_start"),
    (r"pip install torch==2\.13\.0 && pip install -e '\.\[test\]' && python -m pytest", ".ci/run"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft +# a new run", "bench/quickstart.py"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft run\.name=my-run",
     "tests/integration/test_relaunch.py::test_relaunching_a_finished_run_says_so_and_does_nothing"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft cluster\.ranks=2 run\.name=two-ranks",
     "tests/integration/test_signal_one_rank.py::test_a_rank_killed_with_sigkill_is_named_in_one_line_and_the_report_"
     "blames_it"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft optim\.lr=3e-4 train\.max_steps=500 checkpoint=exponential",
     "tests/unit/launch/test_mistakes.py::test_the_readmes_checkpoint_override_changes_tiny_sfts_policy"),
    (r"python -m resilient_slurm\.launch \+experiment=sft model\.pretrained=/models/Llama-3\.2-1B-Instruct",
     "tests/integration/test_sft.py::test_a_pretrained_model_fine_tuned_on_two_ranks_exports_a_model_transformers_"
     "loads"),
    (r"python -m resilient_slurm\.launch \+experiment=llama8b_sft model\.pretrained=.* cluster=slurm", COMPOSED),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft cluster\.ranks=4 parallel\.pp=2 eval\.task_samples=0 "
     r"data\.micro_batch_size=2 +#",
     "tests/integration/test_pipeline_runs.py::test_pipelined_run_interrupted_twice_ends_bit_identical"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft cluster\.ranks=4 parallel\.pp=2 .*interleaved_1f1b",
     "tests/integration/test_pipeline_parity.py::test_pipelined_steps_match_one_process_and_running_out_of_memory_stops_"
     "with_the_fix"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_sft cluster\.ranks=4 parallel\.pp=2 .*parallel\.tp=2",
     "tests/integration/test_pipeline_runs.py::test_resharding_into_and_out_of_tp2_pp2_keeps_the_global_batches"),
    (r"python -m resilient_slurm\.export ", "tests/unit/export/test_export_cli.py::test_on_a_terminal_the_export_draws_a_bar"),
    (r"python -m resilient_slurm\.launch \+experiment=sft model\.pretrained=/models/Qwen2\.5",
     "tests/integration/test_benchmarks.py::test_scores_land_at_the_checkpoints_steps_while_training_goes_on"),
    (r"python -m resilient_slurm\.data tokenize ", "tests/unit/data/test_tokenize.py::test_two_workers_write_the_same_bytes_as_one"),
    (r"python -m resilient_slurm\.data prepare ",
     "tests/unit/data/test_token_commands.py::test_prepare_with_hydra_overrides_builds_what_the_run_start_then_maps"),
    (r"python -m resilient_slurm\.launch \+experiment=llama8b_pretrain cluster=slurm", COMPOSED),
    (r"python -m resilient_slurm\.launch \+experiment=llama70b_pretrain --plan$",
     "tests/unit/launch/test_plan_report.py::test_the_seed_runs_plan_prints_its_layout_memory_batch_checkpoint_and_"
     "collectives"),
    (r"python -m resilient_slurm\.launch \+experiment=tiny_pretrain$",
     "tests/integration/test_tiny_pretrain_learns.py::test_the_tiny_corpus_is_learned_in_a_minute_on_a_cpu"),
    (r"export PYTHONPATH=examples/own_loop$", "tests/integration/test_own_loop.py::test_the_own_loop_interrupted_three_ways_ends_bit_identical"),
    (r"python -m resilient_slurm\.launch --config-dir examples/own_loop/conf entry=own_loop\.train:main \+own=default"
     r"( +cluster\.ranks=2)?( +#.*)?$",
     "tests/integration/test_own_loop.py::test_the_own_loop_interrupted_three_ways_ends_bit_identical"),
    (r"python -m resilient_slurm\.launch --config-dir examples/own_loop/conf .*cluster=slurm cluster\.nodes=2 "
     r"cluster\.spare_nodes=1", "tests/slurm/test_own_loop_jobs.py::test_the_own_loop_continues_on_the_spare_after_a_"
                                "rank_is_killed"),
    (r"sbatch sbatch/train\.sbatch ", "tests/slurm/test_resilient_jobs.py::test_the_sbatch_template_requeued_once_finishes"),
    (r"wandb sync ", NOT_HERE),
    (r"MLFLOW_ALLOW_FILE_STORE=true mlflow ui ", NOT_HERE),
    (r"python -m resilient_slurm\.evaluate ", "tests/unit/evaluate/test_job_and_launcher.py::test_the_by_hand_command_"
                                              "scores_a_checkpoint"),
    (r"python -m resilient_slurm\.report experiments/", "tests/integration/test_tracking_lineage.py::test_two_"
                                                        "interruptions_leave_one_run_with_every_step_once"),
    (r"python -m resilient_slurm\.report RUN_A RUN_B RUN_C", "tests/unit/analysis/test_goodput.py::test_several_runs_"
                                                             "side_by_side_and_a_bad_path"),
    (r"python -m resilient_slurm\.compare RUN_A RUN_B", "tests/unit/analysis/test_compare.py::test_one_changed_key_is_"
                                                        "named_exactly_and_no_warning"),
    (r"python -m resilient_slurm\.launch \+experiment=llama8b_sft cluster=slurm .*cluster\.partition=gpu", COMPOSED),
    (r"python -m resilient_slurm\.launch -m \+experiment=tiny_sft cluster=slurm optim\.lr=1e-4,3e-4",
     "tests/slurm/test_resilient_jobs.py::test_a_two_point_sweep_submits_two_resilient_jobs"),
    (r"python -m resilient_slurm\.launch \+experiment=llama8b_sft cluster=slurm .*cluster\.nodes=16", COMPOSED),
    (r"python -m resilient_slurm\.sweep \+experiment=tiny_sft cluster=slurm sweep=optuna", COMPOSED),
    (r"python -m resilient_slurm\.sweep \+experiment=tiny_sft sweep=(grid|random) ",
     "tests/unit/sweep/test_sweep_cli.py::test_the_default_name_is_the_same_for_the_same_command"),
    (r"python -m resilient_slurm\.sweep \+experiment=tiny_sft sweep=asha ",
     "tests/integration/test_sweep_local.py::test_asha_pauses_and_promotes_through_a_controller_killed_mid_way"),
    (r"python -m resilient_slurm\.sweep \+experiment=tiny_sft sweep=pbt ",
     "tests/integration/test_sweep_local.py::test_a_pbt_exploit_copies_a_checkpoint_and_the_recipient_resumes_with_"
     "the_perturbed_values"),
    (r"python -m resilient_slurm\.sweep \+experiment=tiny_sft cluster=slurm sweep\.controller=slurm",
     "tests/slurm/test_sweep.py::test_the_controller_as_a_slurm_job_requeues_itself_at_its_warning_and_finishes_the_"
     "study"),
    (r"tools/xid_scan --kernel-log ", "tests/unit/health/test_xid_scan_cli.py::test_by_hand_a_fatal_xid_fails_with_one_line"),
    (r"tools/xid_scan exclude (list|clear) ", "tests/unit/health/test_xid_scan_cli.py::test_exclude_subcommands"),
    (r"tools/xid_scan --node-record ", "tests/unit/health/test_xid_scan_cli.py::"
                                       "test_the_scan_marks_a_node_it_takes_out_and_the_node_record_prints_and_clears"),
    (r"python -m resilient_slurm\.checkpoint verify ", "tests/unit/checkpoint/test_verify.py::test_cli_exit_codes_and_one_line"),
    (r"python -m resilient_slurm\.simulate --gpus ", "tests/unit/simulate/test_cli.py::test_json_is_one_object_with_goodput_"
                                                     "and_the_breakdown"),
    (r"python -m resilient_slurm\.simulate --compare", "tests/unit/simulate/test_cli.py::test_compare_covers_every_strategy"),
    (r"python bench/checkpoint\.py --json costs\.json && python -m resilient_slurm\.simulate --from-bench",
     "tests/unit/bench/test_simulate_bench.py::test_the_bench_runs_at_a_toy_size"),
]


def readme_commands(text: str) -> list[str]:
    """The commands of the README's shell blocks (```bash and indented ones), continuation lines joined."""
    out: list[str] = []
    fence: str | None = None
    pending = ""
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else (line[3:].strip() or "text")
            continue
        in_shell = fence == "bash" or (fence is None and line.startswith("    ") and not line.startswith("     "))
        if not (in_shell or pending):
            continue
        pending = f"{pending} {line.strip()}" if pending else line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        if pending.startswith(PROGRAMS):
            out.append(re.sub(r"\s+", " ", pending))
        pending = ""
    return out


COMMANDS = readme_commands(README)


def where_run(cmd: str) -> list[str]:
    return [where for pattern, where in RUN_BY if re.match(pattern, cmd)]


def test_the_readme_has_its_commands():
    assert len(COMMANDS) >= 40 and any("+experiment=tiny_sft" in c for c in COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_readme_command_is_run_by_a_test_that_exists(cmd):
    (where,) = where_run(cmd) or [None]
    assert where is not None, f"README command run by no test: {cmd}; add a test and list it in RUN_BY"
    if where in (COMPOSED, NOT_HERE):
        return
    path, _, function = where.partition("::")
    assert (REPO / path).is_file(), where
    if function:
        assert re.search(rf"^def {function}\(", (REPO / path).read_text(), re.M), f"no test {where}"


def test_no_entry_is_left_over():
    assert [p for p, _ in RUN_BY if not any(re.match(p, c) for c in COMMANDS)] == []


def _launch_argv(cmd: str) -> tuple[str, list[str]] | None:
    words = shlex.split(cmd, comments=True)
    for program in ("resilient_slurm.launch", "resilient_slurm.sweep"):
        if words[:3] == ["python", "-m", program]:
            return program, words[3:]
    if words[:4] == ["python", "-m", "resilient_slurm.data", "prepare"]:
        sources = next(w for c in COMMANDS for w in shlex.split(c, comments=True) if w.startswith("data.sources=["))
        return "prepare", [sources if w == "data.sources=..." else w for w in words[4:]]
    return None


SPACES = re.compile(r"^[\w.]+=(choice|range|interval|tag)\(")


# The models the README's commands name, as their config.json has them (public facts: dimensions,
# RoPE and vocabulary); the weights are not needed to compose and validate a run.
LLAMA_3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128009,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
MODELS = {
    "Meta-Llama-3.1-8B-Instruct": LLAMA_3_8B,
    "Meta-Llama-3.1-8B": LLAMA_3_8B,
    "Llama-3.2-1B-Instruct": {**LLAMA_3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                              "tie_word_embeddings": True},
    "Qwen2.5-0.5B-Instruct": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                              "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
                              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
                              "use_sliding_window": False, "sliding_window": 32768, "eos_token_id": 151645},
}


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _launch_argv(c)])
def test_every_launch_sweep_and_prepare_command_composes_and_validates(cmd, tmp_path):
    """What the command does before it runs anything: the overrides checked, Hydra's composition, the
    model's config.json read, the typed config validated (a sweep's search spaces are left to the
    sweep's own tests; a --plan asks nothing of the data, as the command does). `/models/NAME` is a directory holding NAME's config.json."""
    import json

    from resilient_slurm.model.pretrained import apply_pretrained

    for name, config in MODELS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    program, argv = _launch_argv(cmd)  # type: ignore[misc]
    argv = [re.sub(r"=/models/", f"={tmp_path}/", a) for a in argv if not SPACES.match(a)]
    parsed = command.parse(argv)
    points = sweep_points(list(parsed.overrides)) if parsed.multirun else [list(parsed.overrides)]
    dirs = tuple(REPO / d for d in parsed.config_dirs)
    for point in points:
        check_overrides(point, dirs)
        cfg = to_config(compose(point, dirs), explicit_keys(point), resolve_model=apply_pretrained,
                        data_location=not parsed.plan)
        assert cfg.run.experiment


def test_every_path_the_readme_names_exists():
    named = set(re.findall(r"`((?:resilient_slurm|bench|tools|tests|sbatch|conf|examples)/(?:[\w./-]*\.\w+|[\w./-]*/))`",
                           README))
    named |= set(re.findall(r"\(`?(resilient_slurm/[\w./-]+\.py)", README))
    missing = sorted(p for p in named if "<" not in p and not (REPO / p.rstrip("/")).exists())
    assert missing == []
