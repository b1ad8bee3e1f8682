"""Standard benchmarks on a run's checkpoints with lm-evaluation-harness, beside training: each
evaluation exports a checkpoint to Hugging Face layout and runs lm-eval on it in a process (or a
Slurm job) of its own; scores land in benchmarks.jsonl at the checkpoint's step.

Modules, from the trainer's hook to the scores:
    launcher   SideEvaluations: which steps, the retention pin, a child process or an sbatch job
    job        one evaluation: wait for the commit, export, lm-eval, record; retried once
    harness    lm-eval on one model directory, offline, scores flattened (lm-eval imported lazily)
    tasks      the shipped tiny tasks (tasks/: tiny_mmlu, tiny_gsm8k) and the user's task YAMLs
    __main__   `python -m resilient_slurm.evaluate RUN_DIR --step N [--tasks ...]`
"""
