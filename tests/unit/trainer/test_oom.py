"""Out of memory inside a step, on one rank (the agreement between ranks is tested with two, in
tests/integration/test_oom_agreement.py). torch.OutOfMemoryError is raised by hand: there is no GPU."""

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from resilient_slurm.config import Config, ModelConfig
from resilient_slurm.parallel import fsdp
from resilient_slurm.trainer.oom import StepOutOfMemory, inside_fsdp
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.trainer.step import StepRunner
from resilient_slurm.data.batches import Batch
from tests.single_rank import one_rank

MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                    num_kv_heads=1, max_seq_len=16)


def trainer() -> StepRunner:
    comm = one_rank()
    model = fsdp.build_model(MODEL, comm.mesh, comm.device)
    fsdp.fill_random(model, MODEL, 1)
    optimizer = build_optimizer(model, Config().optim)
    return StepRunner(model, optimizer, build_scheduler(optimizer, Config().optim, 10), comm, 1.0)


def batches(micro: int) -> list[Batch]:
    ids = torch.randint(0, MODEL.vocab_size, (4, 9), generator=torch.Generator().manual_seed(0))
    rows = Batch(ids[:, :-1], ids[:, 1:], torch.arange(8).expand(4, 8), torch.zeros(4, 8, dtype=torch.long))
    return [Batch(*(t[i:i + micro] for t in (rows.input_ids, rows.labels, rows.position_ids, rows.document_ids)))
            for i in range(0, 4, micro)]


def out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory (injected)")


@pytest.mark.parametrize("method", ["unshard", "post_backward"])
def test_an_oom_inside_fsdp2s_collectives_is_not_agreed_but_raised(monkeypatch, method):
    """There a collective may be half issued: no count can match it. The post-backward runs inside
    the autograd engine: its frames still show in the traceback."""
    t = trainer()
    monkeypatch.setattr(FSDPParamGroup, method, out_of_memory)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        t.step(batches(4))
    assert inside_fsdp(raised.value)


def test_an_oom_in_the_forward_frees_the_step_and_the_step_redone_smaller_is_a_clean_one():
    clean = trainer()
    expected = clean.step(batches(2))
    t = trainer()
    handle = t.model.get_submodule("model.layers.1").register_forward_pre_hook(out_of_memory)
    with pytest.raises(StepOutOfMemory) as raised:
        t.step(batches(4))
    handle.remove()
    oom = raised.value
    assert (oom.phase, oom.ranks, oom.errors) == ("forward/backward", [0], ["CUDA out of memory (injected)"])
    assert oom.memory[0]["rss_bytes"] > 0 and oom.memory[0]["max_rss_bytes"] > 0
    assert all(p.grad is None for p in t.model.parameters())
    redone = t.step(batches(2))
    assert (redone.loss, redone.grad_norm) == (expected.loss, expected.grad_norm)
    assert all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(t.model.parameters(), clean.model.parameters()))
