"""One optimizer step through the pipeline stages (`parallel.pp > 1`): StepRunner's step, whose
forwards and backwards are a pipeline schedule's and whose gradient norm spans the stages.

The loss is the non-pipelined step's: each micro-batch's summed token loss over the global
target-token count, computed on the last stage (the schedule's loss function, with
`scale_grads=False`), its gradients summed over the data-parallel ranks by FSDP2 after the stage's
last backward. Each stage gets only what it needs of the rank's micro-batches: the token ids to the
first, the labels to the last, positions and document ids to all (they make the rotary tables and
the attention mask there). The global norm is the square root of the stages' summed squared norms
(torchtitan's; parallel/clip.py), the tied embedding's copy counted once. Under tensor parallelism
the last stage's logits stay sharded on the vocabulary, and the whole schedule runs under
`loss_parallel` (the loss's backward starts inside it).

Running out of memory is not retried under a pipeline: the rank that ran out cannot tell its
pipeline peers, which wait for it in point-to-point receives that no agreement point can reach
(trainer/oom.py agrees at FSDP2 units, which the stages run at different times). That rank stops
with a line naming the micro-batch to lower (`PipelineOutOfMemory`, recorded as its crash), and
the launcher ends its waiting peers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor.parallel import loss_parallel

from resilient_slurm.data.batches import Batch
from resilient_slurm.errors import InputError
from resilient_slurm.model.decoder import token_loss_sum
from resilient_slurm.parallel.clip import grad_norm
from resilient_slurm.parallel.pipeline import Stages
from resilient_slurm.session.distributed import Comm
from resilient_slurm.trainer.oom import describe
from resilient_slurm.trainer.step import StepRunner


class PipelineOutOfMemory(InputError):
    """A rank ran out of device memory in a pipelined step: the step cannot be redone smaller."""


class PipelineStepRunner(StepRunner):
    def __init__(self, stages: Stages, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, comm: Comm, grad_clip: float,
                 documents: bool = True, counts_data: bool = True, vocab_parallel: bool = False) -> None:
        super().__init__(stages.view, optimizer, scheduler, comm, grad_clip, documents, counts_data,
                         vocab_parallel=vocab_parallel, guard=False)
        self.stages = stages
        self.norm_params = stages.norm_parameters()
        self.schedule: Any = None
        self.micro_batches = 0
        self.scale = 1.0
        self.poison = False
        self.sums: list[torch.Tensor] = []
        self.progress: Callable[[], None] | None = None
        for m in stages.modules:  # the heartbeat beats at each micro-batch's forward on every stage
            m.register_forward_pre_hook(lambda *_: self.progress() if self.progress is not None else None)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        micro = token_loss_sum(logits, labels)
        if self.poison:
            micro = micro * float("nan")
        # torch also calls this once to infer shapes at the first step: the step's own are the last.
        self.sums.append(micro.detach())
        return micro / self.scale

    def _compute(self, micro_batches: list[Batch], global_tokens: float, poison: bool,
                 progress: Callable[[], None] | None) -> torch.Tensor:
        n = len(micro_batches)
        if self.schedule is None or self.micro_batches != n:
            self.schedule, self.micro_batches = self.stages.schedule(n, self._loss), n
        self.scale, self.poison, self.progress = global_tokens, poison, progress
        self.sums.clear()
        st, device = self.stages, self.comm.device

        def joined(field: str) -> torch.Tensor:
            return torch.cat([getattr(b, field) for b in micro_batches]).to(device)

        kwargs = {"position_ids": joined("position_ids")}
        if self.documents:
            kwargs["document_ids"] = joined("document_ids")
        args = (joined("input_ids"),) if st.first else ()
        target = joined("labels") if st.last else None
        error: str | None = None
        try:
            # The last stage's backward starts from the loss: under TP both need loss_parallel.
            with loss_parallel() if self.vocab_parallel else contextlib.nullcontext():
                self.schedule.step(*args, target=target, return_outputs=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - torch wraps a stage forward's error in its own
            oom = _out_of_memory_in(e)
            if oom is None:
                raise
            error = describe(oom)
        if error is not None:  # out of the handler: its frames' activations are gone
            raise self._out_of_memory("forward/backward", error)
        st.sync_tied()
        self.progress = None
        loss_sum = torch.zeros((), dtype=torch.float64)
        for micro in self.sums[len(self.sums) - n:] if st.last else []:
            loss_sum += micro.double().cpu()
        return loss_sum

    def _clip(self) -> float:
        norm = grad_norm(self.norm_params, self.stages.group)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm)
        return float(norm)

    def _abandon_update(self, error: str | None) -> Exception:
        return self._out_of_memory("optimizer step", error or "another rank ran out")

    def _out_of_memory(self, phase: str, error: str) -> PipelineOutOfMemory:
        return PipelineOutOfMemory(
            f"data.micro_batch_size: out of device memory in the {phase} under pipeline parallelism on rank "
            f"{self.comm.rank} ({error}); a pipelined step is not redone at a smaller micro-batch (the other stages "
            f"wait for this one in point-to-point transfers); lower data.micro_batch_size, turn on "
            f"model.activation_checkpointing, or raise parallel.pp")


def _out_of_memory_in(error: BaseException | None) -> BaseException | None:
    """The out-of-memory error `error` is or was raised from (PipelineStage.forward_one_chunk
    re-raises a stage's error as a RuntimeError from it), else None."""
    while error is not None and not isinstance(error, torch.OutOfMemoryError):
        error = error.__cause__
    return error
