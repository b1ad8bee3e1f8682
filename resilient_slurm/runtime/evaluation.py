"""Periodic evaluation on the held-out split: validation loss, task metrics, sample predictions.

The validation loss is the mean token loss over the whole split (`data.val_samples`). Task
metrics are the hook for what a benchmark scores (MMLU accuracy, GSM8K, HumanEval pass@1 on a real
recipe): a `TaskMetric` judges each of the first `eval.task_samples` samples right or wrong, and
the metric is the fraction judged right. The built-in one, `ExactMatch`, decodes the response
greedily and compares it with the target token for token, EOS included. Greedy decoding
recomputes the whole sequence for each new token (the model has no KV cache): cheap for the
synthetic task's short responses, quadratic for long ones, so keep the sample count small on big
recipes.

Evaluation is read-only: it runs under `torch.inference_mode`, draws no random numbers and
leaves no state behind (the next training step puts the model back in train mode), so a run that
evaluates is bit-identical to one that does not, and its resume stays exact. The samples are
split over the ranks (sample i on rank i mod world) and the sums are all-reduced, so every rank
must call `run` at the same step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from resilient_slurm.config import Config
from resilient_slurm.runtime.distributed import Comm
from resilient_slurm.workload.data import (
    BOS,
    EOS,
    FIRST_ITEM,
    SEP,
    TASK_TOKEN,
    VAL_SPLIT,
    Sample,
    collate,
    make_sample,
)
from resilient_slurm.workload.model import IGNORE_INDEX, token_loss_sum

_TASK_OF_TOKEN = {token: task for task, token in TASK_TOKEN.items()}


@dataclass(frozen=True)
class Prediction:
    task: str
    prompt: str
    target: str
    prediction: str
    correct: bool


class TaskMetric(Protocol):
    name: str
    """Key of the metric in metrics.jsonl and wandb (where tracking/wandb_tracker.py may rename it)."""

    def judge(self, model: nn.Module, samples: list[Sample], device: torch.device, batch: int) -> list[Prediction]:
        """One prediction per sample, in order, each judged `correct` or not."""


@dataclass(frozen=True)
class EvalResult:
    val_loss: float
    task: dict[str, float]
    """Each task metric: the fraction of eval.task_samples judged correct, over all ranks."""
    seconds: float
    predictions: dict[str, list[Prediction]]
    """Per task metric, the first eval.predictions samples of rank 0."""


class Evaluator:
    def __init__(self, cfg: Config, model: nn.Module, comm: Comm,
                 metrics: Sequence[TaskMetric] | None = None) -> None:
        self.every = cfg.eval.every_steps
        self.max_steps = cfg.train.max_steps
        self.batch = cfg.data.micro_batch_size
        self.seq_len = cfg.data.seq_len
        self.show = cfg.eval.predictions
        self.model, self.comm = model, comm
        mine = range(comm.rank, cfg.data.val_samples, comm.world_size)
        self.loss_samples = [make_sample(cfg.data, cfg.train.seed, VAL_SPLIT, i) for i in mine]
        judged = range(comm.rank, min(cfg.eval.task_samples, cfg.data.val_samples), comm.world_size)
        self.task_samples = self.loss_samples[: len(judged)]
        self.metrics = list(metrics if metrics is not None else [ExactMatch()]) if cfg.eval.task_samples else []

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.max_steps)

    @torch.inference_mode()
    def run(self) -> EvalResult:
        start = time.perf_counter()
        self.model.eval()
        loss_sum, tokens = 0.0, 0.0
        for i in range(0, len(self.loss_samples), self.batch):
            inputs, targets = collate(self.loss_samples[i : i + self.batch], self.seq_len)
            targets = targets.to(self.comm.device)
            loss_sum += float(token_loss_sum(self.model(inputs.to(self.comm.device)), targets))
            tokens += float((targets != IGNORE_INDEX).sum())
        judged = {m.name: m.judge(self.model, self.task_samples, self.comm.device, self.batch) for m in self.metrics}
        counts = [float(sum(p.correct for p in judged[m.name])) for m in self.metrics]
        totals = self.comm.sum_floats([loss_sum, tokens, float(len(self.task_samples)), *counts])
        return EvalResult(
            val_loss=totals[0] / max(totals[1], 1.0),
            task={m.name: right / max(totals[2], 1.0) for m, right in zip(self.metrics, totals[3:])},
            seconds=time.perf_counter() - start,
            predictions={name: p[: self.show] for name, p in judged.items()} if self.comm.rank == 0 else {},
        )


class ExactMatch:
    """The decoded response equals the target exactly (the synthetic SFT task's metric)."""

    name = "exact_match"

    def judge(self, model: nn.Module, samples: list[Sample], device: torch.device, batch: int) -> list[Prediction]:
        # Samples with equal prompt lengths have equal response lengths (n items -> n + 1 tokens
        # with EOS), so each group decodes as one batch without padding or attention masks.
        by_length: dict[int, list[int]] = {}
        for index, sample in enumerate(samples):
            by_length.setdefault(len(sample.prompt), []).append(index)
        out: dict[int, Prediction] = {}
        for indices in by_length.values():
            for i in range(0, len(indices), batch):
                chunk = indices[i : i + batch]
                for j, tokens in zip(chunk, greedy_decode(model, [samples[j] for j in chunk], device)):
                    out[j] = _prediction(samples[j], tokens)
        return [out[j] for j in sorted(out)]


def greedy_decode(model: nn.Module, samples: list[Sample], device: torch.device) -> list[list[int]]:
    """The argmax continuation of each prompt, as long as its target (all prompts equally long)."""
    seq = torch.tensor([s.prompt for s in samples], dtype=torch.long, device=device)
    for _ in range(len(samples[0].response)):
        next_tokens = model(seq)[:, -1].argmax(dim=-1, keepdim=True)
        seq = torch.cat((seq, next_tokens), dim=1)
    return seq[:, len(samples[0].prompt) :].tolist()


def _prediction(sample: Sample, decoded: list[int]) -> Prediction:
    return Prediction(
        task=sample.task, prompt=render_tokens(sample.prompt), target=render_tokens(sample.response),
        prediction=render_tokens(decoded), correct=decoded == sample.response,
    )


def render_tokens(tokens: list[int]) -> str:
    """Readable text of the synthetic vocabulary: `reverse 3 17 5 |`, `5 17 3 </s>`."""
    words = []
    for t in tokens:
        if t >= FIRST_ITEM:
            words.append(str(t - FIRST_ITEM))
        elif t in _TASK_OF_TOKEN:
            words.append(_TASK_OF_TOKEN[t])
        elif t == EOS:
            words.append("</s>")
        elif t == SEP:
            words.append("|")
        elif t != BOS:
            words.append(f"<{t}>")
    return " ".join(words)
