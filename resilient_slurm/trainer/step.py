"""One optimizer step of the sharded model over the global batch. Knows nothing of Slurm, Hydra or wandb.

The loss is the mean over every target token of the global batch (all ranks, all micro-batches),
so a step means the same thing whatever the world size and accumulation: each micro-batch's
summed loss is divided by the global target-token count before its backward, and FSDP2 sums the
gradients over ranks (parallel/fsdp.py). FSDP2 reduce-scatters after every micro-batch's
backward, so no rank ever holds a whole gradient; the accumulation happens in the sharded float32
gradients. Clipping uses the global norm of the sharded gradients, over every mesh (parallel/clip.py).
Under tensor parallelism the logits stay sharded on the vocabulary and the loss and its backward run
under `loss_parallel`; the TP ranks of a data-parallel group compute the same loss, counted once.

With replica groups (cluster.replica_ft) the process group is one group's, and what the step adds
up over the run is added over the live groups too (`replica.sums`): the token counts before the
first forward, the gradients and the loss after the last backward, and the stop flag with them (so
every group stops at the same step). A reduction that failed (a group died or hung in it) makes the
step `NotCommitted`: nothing was updated, and the trainer does it again under the next quorum.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from resilient_slurm.session.distributed import Comm
from resilient_slurm.session.sections import StepSections
from resilient_slurm.trainer.oom import OomGuard, PeerOutOfMemory, describe, inside_fsdp
from resilient_slurm.data.batches import Batch
from resilient_slurm.model.decoder import IGNORE_INDEX, token_loss_sum
from resilient_slurm.parallel.clip import clip_grad_norm
from resilient_slurm.parallel.tp import communicating
from resilient_slurm.replica import sums
from resilient_slurm.replica.engine import Replicas


@dataclass(frozen=True)
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    tokens: int
    """Tokens processed in the global batch (rows x sequence length)."""
    target_tokens: int
    """Tokens the loss is taken over (assistant turns by default; not prompts or padding)."""
    seconds: float
    compute_s: float
    """This rank's own forward and backward, between the collectives: where a slow GPU shows (the
    collectives make every rank wait for the slowest, so the whole step time cannot tell which)."""
    stop: bool = False
    """With replica groups: whether a rank of any live group asked to stop (agreed by all of them)."""


class NotCommitted(Exception):
    """A reduction over the replica groups failed in this step: nothing was updated, and the step is
    done again, from the same data, under the next quorum."""


class StepRunner:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        comm: Comm,
        grad_clip: float,
        documents: bool = True,
        counts_data: bool = True,
        vocab_parallel: bool = False,
        replicas: Replicas | None = None,
        guard: bool = True,
    ) -> None:
        """`documents`: rows hold several documents (the model keeps attention inside each); False:
        each row is one causal sequence, and the model takes the plain causal kernel. `counts_data`:
        this rank speaks for its data-parallel group in the world-wide sums of tokens and loss (the
        other tensor and pipeline ranks of the group hold the same rows: counted once).
        `vocab_parallel`: the model's logits are sharded on the vocabulary (tensor parallelism).
        `replicas`: the live replica groups the step's sums span besides this process group.
        `guard`: agree on running out of memory at every FSDP2 unit (trainer/oom.py); off where ranks
        run different units (pipeline stages)."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.grad_clip = grad_clip
        self.documents = documents
        self.counts_data = counts_data
        self.vocab_parallel = vocab_parallel
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.guard = OomGuard(model, comm, communicating(model) if vocab_parallel else ()) if guard else None
        self.sections = StepSections()
        """Where the step's forward, backward and optimizer are timed (the heartbeat's, in the trainer)."""
        self.replicas = replicas

    def step(self, micro_batches: list[Batch], poison: bool = False,
             progress: Callable[[], None] | None = None, stop: bool = False) -> StepResult:
        """One optimizer step. `poison` (fault injection) makes the loss NaN, like a bad batch does;
        `progress` is called after each micro-batch's backward (the rank's heartbeat); `stop`: this
        rank was asked to stop (with replica groups, agreed over them in the result).

        When any rank runs out of memory, every rank raises StepOutOfMemory (runtime/oom.py) with the
        step's memory freed: in the forward/backward nothing was updated, so the step can be redone,
        from a clean state; in the optimizer step the update may be half applied, and it cannot.
        """
        start = time.perf_counter()
        local_targets, local_inputs = 0.0, 0.0
        if self.counts_data:
            local_targets = float(sum(int((b.labels != IGNORE_INDEX).sum()) for b in micro_batches))
            local_inputs = float(sum(b.labels.numel() for b in micro_batches))
        if self.replicas is None:
            global_tokens, global_inputs = self.comm.sum_floats([local_targets, local_inputs])
        else:
            global_tokens, global_inputs = self._counts_over_groups(local_targets, local_inputs)
        compute_start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        loss_sum = self._compute(micro_batches, max(global_tokens, 1.0), poison, progress)
        compute_s = time.perf_counter() - compute_start
        counted = float(loss_sum) * self.counts_data
        if self.replicas is not None:
            counted, stop = self._gradients_over_groups(counted, stop)
        error: str | None = None
        with self.sections.timed("optimizer"):
            grad_norm = self._clip()
            lr = self.optimizer.param_groups[0]["lr"]
            try:
                self.optimizer.step()
            except torch.OutOfMemoryError as e:
                error = describe(e)
        # The loss's all-reduce also counts the ranks whose update ran out: no collective more.
        total_loss, ran_out = self.comm.sum_floats([counted, 0.0 if error is None else 1.0])
        if ran_out:
            raise self._abandon_update(error)
        self.scheduler.step()
        return StepResult(
            loss=total_loss / max(global_tokens, 1.0), grad_norm=grad_norm, lr=lr,
            tokens=int(global_inputs), target_tokens=int(global_tokens), seconds=time.perf_counter() - start,
            compute_s=compute_s, stop=stop,
        )

    def _compute(self, micro_batches: list[Batch], global_tokens: float, poison: bool,
                 progress: Callable[[], None] | None) -> torch.Tensor:
        """The step's forwards and backwards, agreed on running out of memory; the summed loss."""
        assert self.guard is not None
        error: str | None = None
        peer = False
        try:
            loss_sum = self._forward_backward(micro_batches, global_tokens, poison, progress)
            self.guard.agree()  # nobody ran out in the last backward's tail either: on to clipping
        except torch.OutOfMemoryError as e:
            if inside_fsdp(e):
                raise
            error = describe(e)
        except PeerOutOfMemory:
            peer = True
        if error is not None or peer:
            if self.replicas is not None:
                self.replicas.abandon("out of device memory")
            # Out of the handler: the error's traceback, and the activations its frames hold, are gone.
            raise self.guard.abandon("forward/backward", error, agreed=False)
        return loss_sum

    def _clip(self) -> float:
        """Clip to the global gradient norm (over every shard) and return it."""
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        return clip_grad_norm(self.params, max_norm)

    def _abandon_update(self, error: str | None) -> Exception:
        """What every rank raises when some rank ran out of memory in the optimizer step."""
        assert self.guard is not None
        return self.guard.abandon("optimizer", error, agreed=True)

    def _counts_over_groups(self, targets: float, inputs: float) -> tuple[float, float]:
        """The global batch's token counts: this rank's summed over the groups, then over this group
        (with whether any rank's reduction failed, so that the whole group drops the step together)."""
        assert self.replicas is not None
        over = sums.sum_floats(self.replicas, [targets, inputs])
        total_targets, total_inputs, failed = self.comm.sum_floats([*over, float(self.replicas.errored())])
        if failed:
            self.replicas.commit()  # says no: the whole group asks, as every step must
            raise NotCommitted("a replica group's reduction failed before the forward")
        return total_targets, total_inputs

    def _gradients_over_groups(self, loss_sum: float, stop: bool) -> tuple[float, bool]:
        """The gradients, the loss and the stop flag summed over the live groups; the step committed
        (every rank of the group agrees) or dropped."""
        assert self.replicas is not None
        sums.sum_gradients(self.replicas, self.params)
        loss, stops = sums.sum_floats(self.replicas, [loss_sum, float(stop)])
        if not self.replicas.commit():
            raise NotCommitted("a replica group's reduction failed after the backward")
        return loss, stops > 0

    def _forward_backward(self, micro_batches: list[Batch], global_tokens: float, poison: bool,
                          progress: Callable[[], None] | None) -> torch.Tensor:
        """Each micro-batch's forward and backward; the summed loss. Its own frame, so that an error
        takes the micro-batch's activations with it."""
        loss_sum = torch.zeros((), dtype=torch.float64)
        with loss_parallel() if self.vocab_parallel else contextlib.nullcontext():
            for batch in micro_batches:
                loss_sum += self._micro_batch(batch, global_tokens, poison)
                if progress is not None:
                    progress()
        return loss_sum

    def _micro_batch(self, batch: Batch, global_tokens: float, poison: bool) -> torch.Tensor:
        b = batch.to(self.comm.device)
        with self.sections.timed("forward"):
            micro_loss = token_loss_sum(
                self.model(b.input_ids, b.position_ids, b.document_ids if self.documents else None), b.labels)
        if poison:
            micro_loss = micro_loss * float("nan")
        with self.sections.timed("backward"):
            (micro_loss / global_tokens).backward()
        return micro_loss.detach().double().cpu()
