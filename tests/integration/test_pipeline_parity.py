"""Pipeline parallelism against one process: 4 gloo ranks as pp 2 x dp 2 (real FSDP2 and
torch.distributed.pipelining) with each schedule, as tp 2 x pp 2 (DTensor tensor parallelism in
each stage, the loss vocabulary-parallel), and a tied-embedding model; a model written by
transformers' save_pretrained, three optimizer steps of the project's PipelineStepRunner each. Each rank also
trains the whole model alone (the reference) on the same global batches: step 1's loss agrees to
1e-5 relative, and after three steps the tied embedding's two copies (first and last stage) are
bit-equal and agree with the reference's weight. Last, a stage's forward runs out of memory on rank
0 (torch.OutOfMemoryError raised by hand, the CUDA allocator's type; there is no GPU here): that
rank stops with the line that names the fix, and its peers, waiting for it, are ended by mp.spawn
as the launcher would end them."""

import pytest
import torch
import torch.multiprocessing as mp

from resilient_slurm.config import Config, ModelConfig, ParallelConfig
from resilient_slurm.config.parallel import resolve
from resilient_slurm.data.batches import Batch, rank_micro_batches
from resilient_slurm.model.decoder import IGNORE_INDEX, LlamaForCausalLM, token_loss_sum
from resilient_slurm.model.pretrained import apply_pretrained
from resilient_slurm.parallel.mesh import ParallelMesh
from resilient_slurm.parallel.pipeline import TIED
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.trainer import build
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.trainer.pipeline_step import PipelineStepRunner
from tests.hf_model import make_hf_model
from tests.ports import free_port

pytestmark = pytest.mark.slow

WORLD, ROWS, SEQ, MICRO, STEPS = 4, 8, 16, 1, 3
CASES = [("1f1b", False, 1), ("gpipe", False, 1), ("interleaved_1f1b", False, 1), ("1f1b", True, 1),
         ("1f1b", False, 2)]
"""(schedule, tied embeddings, tp): pp 2 x dp 2, or tp 2 x pp 2."""


def batches(vocab: int) -> list[Batch]:
    """STEPS global batches of ROWS rows: random tokens, two documents a row, a few unlabelled tokens."""
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, vocab, (ROWS, SEQ + 1), generator=g)
        docs = (torch.arange(SEQ) >= SEQ // 2).long().expand(ROWS, SEQ).contiguous()
        labels = ids[:, 1:].clone()
        labels[:, SEQ // 2 - 1] = IGNORE_INDEX  # nothing predicts across the document boundary
        labels[:, :3] = IGNORE_INDEX
        positions = torch.arange(SEQ).expand(ROWS, SEQ) % (SEQ // 2)
        out.append(Batch(ids[:, :-1], labels, positions.contiguous(), docs))
    return out


def rows(b: Batch, index: list[int]) -> Batch:
    return Batch(*(t[index] for t in (b.input_ids, b.labels, b.position_ids, b.document_ids)))


def reference(cfg: Config, data: list[Batch]) -> tuple[list[float], torch.Tensor]:
    """The whole model trained alone, as StepRunner trains it: the losses and the embedding after."""
    model = LlamaForCausalLM(cfg.model)
    build.fill_initial(model, cfg)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, 10)
    losses = []
    for b in data:
        optimizer.zero_grad(set_to_none=True)
        tokens = float((b.labels != IGNORE_INDEX).sum())
        total = 0.0
        for i in range(0, ROWS, MICRO):
            micro = rows(b, list(range(i, i + MICRO)))
            loss = token_loss_sum(model(micro.input_ids, micro.position_ids, micro.document_ids), micro.labels)
            (loss / tokens).backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(total / tokens)
    return losses, model.model.embed_tokens.weight.detach().clone()


def _worker(rank: int, port: int, hf: dict[bool, str]) -> None:
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, WORLD, rank, "127.0.0.1", port))
    for schedule, tied, tp in CASES:
        model = apply_pretrained(ModelConfig(pretrained=hf[tied]))
        assert model.tie_embeddings is tied
        cfg = Config(model=model, parallel=ParallelConfig(pp=2, pp_schedule=schedule, tp=tp))
        layout = resolve(cfg.parallel, WORLD)
        assert not isinstance(layout, str)
        mesh = ParallelMesh(layout, "cpu", rank)
        place = mesh.position
        stages = build.build_pipeline(cfg, comm, mesh)
        optimizer = build_optimizer(stages.view, cfg.optim)
        runner = PipelineStepRunner(stages, optimizer, build_scheduler(optimizer, cfg.optim, 10), comm,
                                    cfg.optim.grad_clip, counts_data=place.counts_data, vocab_parallel=tp > 1)
        data = batches(model.vocab_size)
        accumulation = ROWS // (MICRO * place.dp_size)
        got = []
        for b in data:
            mine = rank_micro_batches(list(range(ROWS)), MICRO, place.dp_size, place.dp_rank, accumulation)
            got.append(runner.step([rows(b, m) for m in mine]).loss)
        expected, embedding = reference(cfg, data)
        case = f"{schedule}{' tied' if tied else ''} tp {tp}"
        assert abs(got[0] - expected[0]) <= 1e-5 * abs(expected[0]), (case, got[0], expected[0])
        assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, expected)), (case, got, expected)
        if tied:
            # Both copies, whole, on every rank of the pair: the same bits, and the reference's values.
            copy = stages.view.get_parameter(TIED).full_tensor() if stages.first or stages.last else None
            copies = comm.all_gather_object(copy)
            first, last = copies[rank % 2], copies[2 + rank % 2]  # pp 0 and pp 1 of this rank's coordinate
            assert torch.equal(first, last), case
            assert torch.allclose(first, embedding, rtol=0, atol=1e-5), (case, float((first - embedding).abs().max()))

    if rank == 0:
        next(iter(stages.modules[0].model.layers.values())).register_forward_pre_hook(_out_of_memory)
    runner.step([rows(data[0], m) for m in mine])
    comm.close()


def _out_of_memory(*_: object) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def test_pipelined_steps_match_one_process_and_running_out_of_memory_stops_with_the_fix(tmp_path):
    hf = {tied: str(make_hf_model(tmp_path / f"tied-{tied}", num_hidden_layers=4, tie_word_embeddings=tied))
          for tied in (False, True)}
    with pytest.raises(mp.ProcessRaisedException) as stopped:
        mp.spawn(_worker, args=(free_port(), hf), nprocs=WORLD, join=True)
    assert "PipelineOutOfMemory: data.micro_batch_size: out of device memory in the forward/backward under pipeline " \
           "parallelism on rank 0 (CUDA out of memory. Tried to allocate 2.00 GiB (injected)); a pipelined step is " \
           "not redone" in str(stopped.value), str(stopped.value)[-3000:]

