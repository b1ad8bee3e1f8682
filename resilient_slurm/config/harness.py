"""`eval.harness.*`: standard benchmarks (lm-evaluation-harness) on checkpoints, beside training. [pure]"""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_slurm.config.checks import Problems

LAUNCHERS = ("auto", "local", "slurm")


@dataclass
class HarnessConfig:
    tasks: list[str] = field(default_factory=list)
    """lm-eval task names: tiny_mmlu and tiny_gsm8k (shipped, made up, MMLU's and GSM8K's formats),
    tasks of the YAMLs in `include_path`, or any of lm-eval's own whose data is available offline
    (nothing is downloaded)."""
    every_steps: int = 0
    """Evaluate the checkpoint of every N-th step, and of the last (0 = off). The run saves a
    checkpoint at those steps if its policy does not, then starts the evaluation as a job of its
    own and trains on: it exports the checkpoint to Hugging Face layout and runs lm-eval on it.
    Scores land in benchmarks.jsonl at the checkpoint's step, the tracker and the report."""
    include_path: str = ""
    """A directory of your own task YAMLs (`dataset_path: json` with absolute `data_files`)."""
    num_fewshot: int | None = None
    """Few-shot examples per prompt; null: each task's own default."""
    limit: int | None = None
    """Examples per task (a quick look on a big benchmark); null: all."""
    batch_size: int = 8
    dtype: str = "bfloat16"
    """Of the exported weights and the evaluated model (float32 on CPU-only machines)."""
    chat_template: bool = False
    """Prompt through the model's chat template (lm-eval's apply_chat_template); off, as MMLU and
    GSM8K are usually reported."""
    launcher: str = "auto"
    """local: a child process of rank 0; slurm: a job of its own (one GPU); auto: slurm when the run
    is a Slurm job (cluster=slurm), else local."""
    partition: str | None = None
    """The evaluation job's partition; null: cluster.partition."""
    account: str | None = None
    """The evaluation job's account; null: cluster.account."""
    gpus: int = 1
    """GPUs of the evaluation job (0: CPU only)."""
    time_min: int = 60
    """Time limit of the evaluation job."""
    wait_commit_s: float = 3600.0
    """How long the evaluation waits for its checkpoint to be committed (an async save) before it fails."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.every_steps >= 0, f"eval.harness.every_steps: {self.every_steps}; set it >= 0 (0 = off)")
        p.need(not self.every_steps or bool(self.tasks),
               "eval.harness.tasks: empty while eval.harness.every_steps is set; name tasks, e.g. "
               "eval.harness.tasks=[tiny_mmlu,tiny_gsm8k]")
        p.need(self.launcher in LAUNCHERS,
               f"eval.harness.launcher: {self.launcher!r} unknown; use one of {', '.join(LAUNCHERS)}")
        p.need(self.batch_size >= 1, f"eval.harness.batch_size: {self.batch_size}; set it to 1 or more")
        p.need(self.dtype in ("float32", "bfloat16", "float16"),
               f"eval.harness.dtype: {self.dtype!r}; use float32, bfloat16 or float16")
        p.need(self.limit is None or self.limit >= 1, f"eval.harness.limit: {self.limit}; set it >= 1, or null for all")
        p.need(self.gpus >= 0 and self.time_min >= 1,
               f"eval.harness.gpus: {self.gpus}, eval.harness.time_min: {self.time_min}; set gpus >= 0, time_min >= 1")
        return p
