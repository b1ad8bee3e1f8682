"""A CUDA out-of-memory error inside a step, agreed by every rank, and the step's state freed after it.

The error is raised on one rank's host thread, at the allocation that failed, while the other ranks
go on to the next collective. Collectives match by order, so the rank that ran out cannot simply
announce it: its message would meet a peer's FSDP2 all-gather. Instead every rank stops at an
agreement point right before each FSDP2 collective of the forward and backward, where all of them
count the ranks that ran out (one host-side all-reduce, `Comm.count`). The rank that ran out
makes the one count its peers are waiting in; a count above zero makes every rank abandon the step
there. Agreement points (`OomGuard`), per FSDP2 unit:
- before its forward (FSDP2 all-gathers its parameters in its forward pre-hook);
- in the backward, before the gradient reaches its output (FSDP2's pre-backward all-gathers it
  and prefetches the next unit) and before it leaves through its inputs (its post-backward
  reduce-scatters the gradients);
- at the end of the backward, before the root unit's final callback (the root's reduce-scatter);
and `Trainer.step` adds one after the last micro-batch, before clipping; an error in the optimizer
step is counted in the step's last all-reduce (the loss's). Under tensor parallelism the modules
whose styles communicate inside a unit (parallel/tp.py `communicating`: attention's and the MLP's
input all-gathers, o_proj's, down_proj's and the embedding's reduce-scatters, the head's gather)
get the same points, and one more between their compute and their output's collective. Cost: one all-reduce of one integer per
point, three per unit and micro-batch (bench/oom_guard.py).

Not agreed, so ordinary crashes as before: an error inside FSDP2's own hooks (its communication
buffers), which may leave a collective issued on some ranks and not on others, so that no count can
be matched safely (`inside_fsdp`); and one inside gradient clipping, whose collective is torch's.
Without a process group of several ranks no hooks are installed.

After the step is abandoned, FSDP2's `reset_iter_state` puts its units back to sharded and idle;
the gradients it leaves behind are dropped here (see `abandon`).

Alternatives rejected: agreeing only after the step (the ranks never get there: the healthy ones
wait in a collective the failed one will not join); aborting the communicator and building a new
one (NCCL only, seconds, and FSDP2's mesh is bound to the old group); a collective of device
tensors at each point (it waits for the device to drain, at every unit, on every step).
"""

from __future__ import annotations

import gc
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.distributed.fsdp import FSDPModule

from resilient_slurm.session.distributed import Comm

_FSDP_SOURCE = "/torch/distributed/fsdp/"


class PeerOutOfMemory(RuntimeError):
    """Raised at an agreement point: another rank ran out of memory in this step."""


@dataclass(frozen=True)
class StepOutOfMemory(Exception):
    """Every rank's view of a step abandoned because some rank ran out of memory; the step's
    gradients are zeroed, FSDP2's iteration state reset, cached device memory released."""

    phase: str
    """"forward/backward", or "optimizer" (clipping passed; the update may be half applied)."""
    ranks: list[int]
    """The ranks that ran out."""
    errors: list[str]
    """The error of each rank that ran out (first line), in the order of `ranks`."""
    memory: list[dict[str, float]]
    """Every rank's memory figures when it abandoned the step (`memory_figures`)."""

    def __str__(self) -> str:
        return f"out of memory in the {self.phase} on rank(s) {self.ranks}: {self.errors[0] if self.errors else ''}"


class _AgreeInBackward(torch.autograd.Function):
    """Identity; its backward is an agreement point (and, for the root, queues the last one)."""

    @staticmethod
    def forward(ctx: Any, guard: OomGuard, last: bool, x: torch.Tensor) -> torch.Tensor:
        ctx.guard, ctx.last = guard, last
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        if ctx.last:
            # Runs after every gradient is computed, before the callback FSDP2 queues right after
            # this (the root unit's pre-backward): the embedding's backward is the last compute.
            Variable._execution_engine.queue_callback(ctx.guard.agree)
        ctx.guard.agree()
        return None, None, grad


class OomGuard:
    """The agreement points of one model's FSDP2 units, and the cleanup after an abandoned step."""

    def __init__(self, model: nn.Module, comm: Comm, communicating: Sequence[nn.Module] = ()) -> None:
        """`communicating`: modules that issue collectives of their own inside an FSDP2 unit
        (tensor parallelism's), in their forward pre-hooks and forward hooks."""
        self.model = model
        self.comm = comm
        if not comm.distributed:
            return
        for module in model.modules():
            if isinstance(module, FSDPModule) or any(module is c for c in communicating):
                last = module is model
                # Prepended: before FSDP2's own pre-hook, which all-gathers (and TP's input
                # redistribution). Appended: after FSDP2 wrapped the inputs for its post-backward and
                # hooked the outputs for its pre-backward (and TP's redistributions), so in the
                # backward ours run first.
                module.register_forward_pre_hook(self._before_unit, prepend=True)
                module.register_forward_pre_hook(self._wrap_inputs, with_kwargs=True)
                module.register_forward_hook(lambda m, a, out, last=last: self._wrap(out, last))
        for module in communicating:
            # Before the output's own collective (TP's forward hook: a reduce-scatter, the head's layout).
            module.register_forward_hook(self._after_compute, prepend=True)

    def agree(self, ran_out: bool = False) -> None:
        """Count the ranks that ran out; raise PeerOutOfMemory on the others when any did."""
        if self.comm.count(ran_out) and not ran_out:
            raise PeerOutOfMemory("another rank ran out of memory in this step")

    def abandon(self, phase: str, error: str | None, agreed: bool) -> StepOutOfMemory:
        """After the step failed on some rank: `error` is this rank's own (None when a peer's
        count stopped it). Unless the failure was already counted (`agreed`), the rank that ran
        out makes the count its peers wait in. Then every rank frees the step's memory and learns
        who ran out and every rank's memory figures (one gather)."""
        if error is not None and not agreed:
            self.agree(ran_out=True)
        figures = memory_figures(self.comm.device)
        # FSDP2's reset frees the gathered weights but keeps their parameter objects, with any
        # gradient autograd left on them (the head's, a layer's cut off mid-backward), which the
        # next backward would add to. Until the reset those are the registered parameters of the
        # gathered units: drop their gradients first, then the sharded ones.
        self._drop_gradients()
        if isinstance(self.model, FSDPModule):
            self.model.reset_iter_state()
        self._drop_gradients()
        gc.collect()  # tensors held by the failed step's frames and autograd graph
        if self.comm.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.comm.device)
        everyone = self.comm.all_gather_object((error, figures))
        ranks = [r for r, (e, _) in enumerate(everyone) if e is not None]
        return StepOutOfMemory(phase, ranks, [everyone[r][0] for r in ranks], [f for _, f in everyone])

    def _drop_gradients(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def _before_unit(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():  # evaluation and inference run no backward and are not guarded
            self.agree()

    def _after_compute(self, module: nn.Module, args: Any, out: Any) -> None:
        if torch.is_grad_enabled():
            self.agree()

    def _wrap_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return tuple(self._wrap(a, False) for a in args), {k: self._wrap(v, False) for k, v in kwargs.items()}

    def _wrap(self, value: Any, last: bool) -> Any:
        if isinstance(value, torch.Tensor) and value.requires_grad and torch.is_grad_enabled():
            return _AgreeInBackward.apply(self, last, value)
        return value


def inside_fsdp(error: BaseException) -> bool:
    """Whether `error` was raised inside FSDP2's own code, where a collective may be half issued."""
    tb: TracebackType | None = error.__traceback__
    while tb is not None:
        if _FSDP_SOURCE in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def describe(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return first[:500]


def memory_figures(device: torch.device) -> dict[str, float]:
    """The device's peak allocated and reserved bytes on CUDA; the process's resident and peak
    resident bytes on the host otherwise."""
    if device.type == "cuda":
        return {"max_allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
                "reserved_bytes": float(torch.cuda.memory_reserved(device)),
                "total_bytes": float(torch.cuda.get_device_properties(device).total_memory)}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"rss_bytes": float(rss_bytes()), "max_rss_bytes": float(peak_kib * 1024)}


def rss_bytes() -> int:
    """This process's resident memory: one small read of /proc/self/statm."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
