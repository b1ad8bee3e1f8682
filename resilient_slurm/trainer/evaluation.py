"""Periodic evaluation on the held-out data: validation loss, task metrics, sample predictions.

The validation loss is the mean token loss over every held-out row (`data.val_samples`
conversations, packed like the training rows, so each attends only to itself). A token mixture
(`data.kind=tokens`) holds out `data.val_sequences` windows per source: the loss and its
perplexity are reported per source too (`val_loss/<source>`, `val_ppl/<source>`). Task metrics are the
hook for what a benchmark scores (MMLU accuracy, GSM8K, HumanEval pass@1 on a real recipe): a
`TaskMetric` judges each of the first `eval.task_samples` held-out conversations right or wrong,
and the metric is the fraction judged right. The built-in one, `ExactMatch`, generates the last
assistant turn greedily through the chat template (the prompt ends with the assistant header) and
compares it with the reference, token for token, through its end-of-turn token. Greedy decoding
recomputes the whole sequence for each new token (the model has no KV cache): cheap for short
answers, quadratic for long ones, so keep the sample count small on big recipes.

The model is sharded (FSDP2, and tensor parallelism), so every rank must run every forward
together: the work is split round-robin over the data-parallel groups (the TP ranks of a group run
the same rows, and their sums count once) and each rank runs the same number of batches and
decoding steps, padding with rows that count for nothing. Under tensor parallelism the loss is
taken from the vocabulary-sharded logits (`loss_parallel`), a decoded token from the last
position's logits gathered whole, and the rows a prompt is decoded in are left-padded to a
multiple of the TP degree (sequence parallelism splits them evenly). Under pipeline parallelism
each batch runs through the stages (a forward-only schedule of one micro-batch) and the loss is
the last stage's; decoding is not built there (config-checked). Evaluation is read-only: it runs under
`torch.no_grad`, draws no random numbers and leaves no state behind, so a run that
evaluates is bit-identical to one that does not, and its resume stays exact.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from resilient_slurm.config import Config, train_steps
from resilient_slurm.console import progress
from resilient_slurm.session.distributed import Comm
from resilient_slurm.data.batches import Batch
from resilient_slurm.data.chat.dataset import ChatData, EvalSample
from resilient_slurm.data.tokens.token_data import TokenData
from resilient_slurm.model.decoder import IGNORE_INDEX, token_loss_sum
from resilient_slurm.parallel.mesh import MeshPosition
from resilient_slurm.parallel.pipeline import Stages


@dataclass(frozen=True)
class Prediction:
    prompt: str
    target: str
    prediction: str
    correct: bool


class TaskMetric(Protocol):
    name: str
    """Key of the metric in metrics.jsonl and wandb."""

    def judge(self, model: nn.Module, samples: list[EvalSample | None], device: torch.device,
              decode: Decode, multiple: int = 1) -> list[Prediction]:
        """One prediction per real sample, in order (None stands for a padding sample this rank runs
        so that every rank runs the same forwards; it gets no prediction). `multiple`: the model
        takes sequences of a multiple of this length (the TP degree)."""


class Decode(Protocol):
    def __call__(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class EvalResult:
    val_loss: float
    task: dict[str, float]
    """Each task metric, and a token mixture's loss and perplexity per source."""
    """Each task metric: the fraction of eval.task_samples judged correct, over all ranks."""
    seconds: float
    predictions: dict[str, list[Prediction]]
    """Per task metric, the first eval.predictions samples of rank 0."""


class Evaluator:
    def __init__(self, cfg: Config, model: nn.Module, comm: Comm, data: ChatData | TokenData,
                 batch_size: int | None = None, metrics: Sequence[TaskMetric] | None = None,
                 documents: bool = True, place: MeshPosition | None = None, stages: Stages | None = None) -> None:
        """`batch_size`: rows per forward; None: data.micro_batch_size (the run passes the one it
        trains at, which a lack of device memory may have lowered). `documents`: as the trainer's
        StepRunner (False: each row is one causal sequence). `place`: this rank in the run's layout
        (None: every rank a data-parallel rank of its own); `stages`: the pipeline stages the forward
        runs through (parallel.pp > 1; the validation loss only, config-checked)."""
        self.every = cfg.eval.every_steps
        self.max_steps = train_steps(cfg)
        self.batch = batch_size or cfg.data.micro_batch_size
        self.show = cfg.eval.predictions
        self.model, self.comm, self.data, self.documents = model, comm, data, documents
        w, r = (place.dp_size, place.dp_rank) if place is not None else (comm.world_size, comm.rank)
        self.counts = place.counts_data if place is not None else True
        self.tp = place.layout.tp if place is not None else 1
        self.stages = stages
        self.schedule: Any = None
        # Named splits: a token mixture's, one per source; the chat data's one, unnamed.
        self.splits = data.val if isinstance(data, TokenData) else {"": data.val}
        if not any(rows.num_rows for rows in self.splits.values()):
            self.every = 0  # nothing held out (data.val_samples=0, or too few rows for 5%): nothing to evaluate
        self.val_rows = {name: _padded(list(range(r, rows.num_rows, w)), rows.num_rows, w, self.batch)
                         for name, rows in self.splits.items()}
        samples = data.eval_samples(cfg.eval.task_samples) if cfg.eval.task_samples and isinstance(data, ChatData) \
            else []
        self.samples = _padded([samples[i] for i in range(r, len(samples), w)], len(samples), w, self.batch)
        self.eos = set(data.tokenizer.eos_ids) if isinstance(data, ChatData) else set()
        self.metrics = list(metrics if metrics is not None else [ExactMatch(self.batch, self.eos, samples)]) \
            if samples else []

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.max_steps)

    @torch.no_grad()  # not inference_mode: loss_parallel needs cross_entropy decomposed (decoder.py)
    def run(self, step: int | None = None) -> EvalResult:
        start = time.perf_counter()
        self.model.eval()
        data = self.data
        chunks = range(0, len(self.samples), self.batch) if isinstance(data, ChatData) else range(0)
        # Rank 0's share stands for every rank's: they run the same number of batches.
        batches = sum(len(range(0, len(rows), self.batch)) for rows in self.val_rows.values())
        bar = progress(batches + len(chunks) * len(self.metrics),
                       "evaluating" + (f" at step {step}" if step is not None else ""), unit="batch",
                       enabled=self.comm.rank == 0, leave=False)
        with loss_parallel() if self.tp > 1 else contextlib.nullcontext():
            sums = self._val_sums(bar)
        judged: dict[str, list[Prediction]] = {m.name: [] for m in self.metrics}
        if isinstance(data, ChatData):
            for m in self.metrics:
                for i in chunks:  # a batch of samples at a time, as judge would cut them: the same forwards
                    judged[m.name] += m.judge(self.model, self.samples[i : i + self.batch], self.comm.device,
                                              data.decode, self.tp)
                    bar.update()
        bar.close()
        # FSDP2 keeps the root's parameters gathered after a forward without a backward (every unit's
        # under a pipeline): shard them again, so the checkpoint and the optimizer see the shards.
        if self.stages:
            self.stages.reshard()
        elif isinstance(self.model, FSDPModule):
            self.model.reshard()
        counts = [float(sum(p.correct for p in judged[m.name])) for m in self.metrics]
        real = float(sum(s is not None for s in self.samples))
        totals = self.comm.sum_floats([v * self.counts for v in (*sums, real, *counts)])
        n = len(sums)
        losses = {name: totals[2 * i] / max(totals[2 * i + 1], 1.0) for i, name in enumerate(self.splits)}
        per_source = {f"{key}/{name}": value for name, loss in losses.items() if name
                      for key, value in (("val_loss", loss), ("val_ppl", math.exp(min(loss, 50.0))))}
        return EvalResult(
            val_loss=sum(totals[0:n:2]) / max(sum(totals[1:n:2]), 1.0),
            task={**{m.name: right / max(totals[n], 1.0) for m, right in zip(self.metrics, totals[n + 1:])},
                  **per_source},
            seconds=time.perf_counter() - start,
            predictions={name: p[: self.show] for name, p in judged.items()} if self.comm.rank == 0 else {},
        )

    def _val_sums(self, bar: Any) -> list[float]:
        """Each split's summed loss and target tokens over this rank's rows."""
        sums: list[float] = []
        for name, val_rows in self.val_rows.items():
            loss_sum, tokens = 0.0, 0.0
            for i in range(0, len(val_rows), self.batch):
                rows = val_rows[i : i + self.batch]
                b = self.splits[name].batch([row if row is not None else 0 for row in rows]).to(self.comm.device)
                labels = _mask_padding(b, rows)
                loss_sum += self._pipelined(b, labels) if self.stages else float(token_loss_sum(
                    self.model(b.input_ids, b.position_ids, b.document_ids if self.documents else None), labels))
                tokens += float((labels != IGNORE_INDEX).sum())
                bar.update()
            sums += [loss_sum, tokens]
        return sums

    def _pipelined(self, b: Batch, labels: torch.Tensor) -> float:
        """The summed token loss of one batch through the pipeline: on the last stage; 0 elsewhere."""
        assert self.stages is not None
        st = self.stages
        if self.schedule is None:
            self.schedule = st.eval_schedule(token_loss_sum)
        kwargs = {"position_ids": b.position_ids}
        if self.documents:
            kwargs["document_ids"] = b.document_ids
        losses: list[torch.Tensor] = []
        self.schedule.eval(*((b.input_ids,) if st.first else ()), target=labels if st.last else None,
                           losses=losses, **kwargs)
        return float(sum(losses)) if st.last else 0.0


def _padded(mine: list, total: int, world: int, batch: int) -> list:
    """This rank's share, padded with None to the same number of whole batches on every rank."""
    per_rank = math.ceil(total / world) if total else 0
    length = math.ceil(per_rank / batch) * batch
    return mine + [None] * (length - len(mine))


def _mask_padding(b: Batch, rows: list) -> torch.Tensor:
    labels = b.labels.clone()
    for i, row in enumerate(rows):
        if row is None:
            labels[i] = IGNORE_INDEX
    return labels


class ExactMatch:
    """The generated answer equals the reference exactly, through its end-of-turn token."""

    name = "exact_match"

    def __init__(self, batch: int, eos: set[int], all_samples: list[EvalSample]) -> None:
        self.batch = batch
        self.eos = eos
        # Every rank decodes the same number of tokens: as long as the longest reference anywhere.
        self.steps = max((len(s.target_ids) for s in all_samples), default=0)

    def judge(self, model: nn.Module, samples: list[EvalSample | None], device: torch.device,
              decode: Decode, multiple: int = 1) -> list[Prediction]:
        out: list[Prediction] = []
        for i in range(0, len(samples), self.batch):
            chunk = samples[i : i + self.batch]
            prompts = [s.prompt_ids if s is not None else [0] for s in chunk]
            for s, generated in zip(chunk, greedy_decode(model, prompts, self.steps, device, multiple)):
                if s is None:
                    continue
                answer = _through_eos(generated, self.eos)
                out.append(Prediction(s.prompt, s.target, decode(answer), answer == s.target_ids))
        return out


def _through_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def greedy_decode(model: nn.Module, prompts: list[list[int]], steps: int, device: torch.device,
                  multiple: int = 1) -> list[list[int]]:
    """`steps` argmax tokens after each prompt. Prompts of different lengths are left-padded: padding
    is a document of its own (-1) that no real token attends to, and positions start at each
    prompt's first real token, so each row computes exactly what it would alone. Every forward's
    length is a multiple of `multiple` (more left padding, which changes nothing either)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    pos = torch.zeros_like(ids)
    docs = torch.full_like(ids, -1)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        pos[row, width - len(p):] = torch.arange(len(p))
        docs[row, width - len(p):] = 0
    ids, pos, docs = ids.to(device), pos.to(device), docs.to(device)
    for _ in range(steps):
        pad = -ids.shape[1] % multiple
        inputs = [t if not pad else torch.cat((torch.full((t.shape[0], pad), fill, dtype=t.dtype, device=device), t),
                                              dim=1) for t, fill in ((ids, 0), (pos, 0), (docs, -1))]
        last = model(*inputs)[:, -1]
        if isinstance(last, DTensor):  # sharded on the vocabulary: each row's argmax needs all of it
            last = last.full_tensor()
        nxt = last.argmax(dim=-1, keepdim=True)
        ids = torch.cat((ids, nxt), dim=1)
        pos = torch.cat((pos, pos[:, -1:] + 1), dim=1)
        docs = torch.cat((docs, torch.zeros_like(nxt)), dim=1)
    return ids[:, width:].tolist()
