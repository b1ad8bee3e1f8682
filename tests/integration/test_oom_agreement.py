"""A CUDA out-of-memory error on one rank of two (gloo, real FSDP2 processes), raised in the forward,
in the middle of the backward, in the backward's tail (the embedding) and in the optimizer step:
both ranks abandon the step together, and the step redone at half the micro-batch is bit for bit
the step a clean run at that micro-batch takes, and so is the step after it (nothing of the failed
attempt survives in the gradients or in FSDP2's state). torch.OutOfMemoryError is raised by hand
(there is no GPU here): it is the type the CUDA allocator raises, at the same places."""

from collections.abc import Callable

import pytest
import torch
import torch.multiprocessing as mp

from resilient_slurm.config import Config, ModelConfig
from resilient_slurm.parallel import fsdp
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.trainer.oom import StepOutOfMemory
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.trainer.step import StepRunner
from resilient_slurm.data.batches import Batch, rank_micro_batches
from tests.ports import free_port

pytestmark = pytest.mark.slow

MODEL = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4,
                    num_kv_heads=2, max_seq_len=32)
ROWS, SEQ, WORLD = 8, 16, 2


class _Once:
    """Raises torch.OutOfMemoryError the first time it is called while armed."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, *args: object) -> None:
        if self.armed:
            self.armed = False
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, once, x):
        ctx.once = once
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.once()
        return None, grad


def _worker(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, WORLD, rank, "127.0.0.1", port))
    cfg = Config(model=MODEL)
    model = fsdp.build_model(MODEL, comm.mesh, comm.device)
    optimizer = build_optimizer(model, cfg.optim)
    trainer = StepRunner(model, optimizer, build_scheduler(optimizer, cfg.optim, 10), comm, cfg.optim.grad_clip)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, MODEL.vocab_size, (ROWS, SEQ + 1), generator=g)
    rows = Batch(ids[:, :-1], ids[:, 1:], torch.arange(SEQ).expand(ROWS, SEQ).contiguous(),
                 torch.zeros(ROWS, SEQ, dtype=torch.long))

    def reset() -> None:
        fsdp.fill_random(model, MODEL, 1)
        optimizer.state.clear()
        trainer.scheduler = build_scheduler(optimizer, cfg.optim, 10)

    def step(micro: int):
        chunks = rank_micro_batches(list(range(ROWS)), micro, WORLD, rank, ROWS // (micro * WORLD))
        return trainer.step([Batch(*(t[c] for t in (rows.input_ids, rows.labels, rows.position_ids,
                                                    rows.document_ids))) for c in chunks])

    def weights() -> list[torch.Tensor]:
        return [p.to_local().clone() for p in model.parameters()]

    reset()
    whole = step(4)  # the step at the first micro-batch, uninterrupted
    reset()
    clean = [step(2), step(2)]
    clean_weights = weights()

    once = _Once()
    layer1 = model.model.layers["1"]
    layer0_mlp = model.model.layers["0"].mlp
    # Where the CUDA allocator would raise: a layer's forward after FSDP2 gathered its weights; a
    # layer's backward (before its reduce-scatter); the embedding's gradient (the backward's last
    # compute, before the root's reduce-scatter in FSDP2's final callback); the optimizer's update.
    places: dict[str, tuple[int, Callable[[], None]]] = {
        "forward": (1, lambda: layer1.register_forward_pre_hook(once)),
        "backward": (0, lambda: layer0_mlp.register_forward_hook(
            lambda m, a, out: _RaiseInBackward.apply(once, out))),
        "backward tail": (1, lambda: model.model.embed_tokens.register_forward_hook(
            lambda m, a, out: _RaiseInBackward.apply(once, out))),
    }
    for name, (failing, install) in places.items():
        reset()
        handle = install()
        once.armed = rank == failing
        with pytest.raises(StepOutOfMemory) as raised:
            step(4)
        handle.remove()
        oom = raised.value
        assert (oom.phase, oom.ranks) == ("forward/backward", [failing]), name
        assert "injected" in oom.errors[0] and len(oom.memory) == WORLD and oom.memory[failing]["rss_bytes"] > 0
        assert all(p.grad is None for p in model.parameters()), name
        redone = [step(2), step(2)]
        assert [r.loss for r in redone] == [r.loss for r in clean], name
        assert [r.grad_norm for r in redone] == [r.grad_norm for r in clean], name
        assert all(torch.equal(a, b) for a, b in zip(weights(), clean_weights)), name
        # Half the micro-batch sums the same rows in another order: equal up to rounding.
        assert abs(redone[0].loss - whole.loss) <= 1e-6 * abs(whole.loss), (name, redone[0].loss, whole.loss)

    reset()
    real_step = optimizer.step
    optimizer.step = lambda *a, **k: once()  # type: ignore[method-assign]
    once.armed = rank == 0
    with pytest.raises(StepOutOfMemory) as raised:
        step(4)
    optimizer.step = real_step  # type: ignore[method-assign]
    assert (raised.value.phase, raised.value.ranks) == ("optimizer", [0])
    comm.close()


def test_an_oom_on_one_rank_is_agreed_and_the_step_redone_at_half_the_micro_batch_is_exact():
    mp.spawn(_worker, args=(free_port(),), nprocs=WORLD, join=True)
