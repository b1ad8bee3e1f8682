"""Every supported family trains the same step at every layout of 4 gloo ranks: FSDP2 over 4 (dp 4),
FSDP2 x tensor parallelism (dp 2 x tp 2) and HSDP (2 replicas x 2 shards). Each family is a tiny
model `transformers` wrote (`save_pretrained`); every rank fills its box of every weight from the
files, trains two steps of the same global batch (packed rows of two documents, prompt tokens
without loss, two micro-batches per data-parallel rank at dp 4), and the losses and gradient norms
equal the single-rank run's. A LoRA run (Qwen2: adapters beside q/k/v biases, on attention and MLP)
does the same at dp 2 x tp 2. At each layout, rank 0's parameters, gradients, AdamW state and the
activations one micro-batch saves (tests/memory_probe.py) are within 10% of `launch --plan`'s
estimate (parallel/estimate.py). All layouts run in one group of 4 processes (one start for all)."""

import json

import pytest
import torch
import torch.multiprocessing as mp

from resilient_slurm.config import Config, Layout, ModelConfig
from resilient_slurm.data.batches import Batch, rank_micro_batches
from resilient_slurm.model.pretrained import apply_pretrained
from resilient_slurm.parallel import estimate
from resilient_slurm.parallel.mesh import ParallelMesh
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.trainer import build
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.trainer.step import StepRunner
from tests.hf_families import make_family_model
from tests.memory_probe import saved_bytes, static_bytes
from tests.ports import free_port
from tests.single_rank import one_rank

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
LAYOUTS = {"dp4": Layout(1, 4, 1, 1), "dp2xtp2": Layout(1, 2, 2, 1), "hsdp2x2": Layout(2, 2, 1, 1)}
LORA = ("qwen2-lora", "qwen2", ["q_proj", "v_proj", "o_proj", "down_proj"])
ROWS, SEQ, MICRO, STEPS = 8, 16, 1, 2


def global_batch() -> Batch:
    """Packed rows: two documents each (positions restart), the first 3 tokens of each without loss."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 480, (ROWS, SEQ), generator=g)
    labels = torch.randint(0, 480, (ROWS, SEQ), generator=g)
    docs = (torch.arange(SEQ) >= SEQ // 2).long().expand(ROWS, SEQ).contiguous()
    pos = torch.cat((torch.arange(SEQ // 2), torch.arange(SEQ // 2))).expand(ROWS, SEQ).contiguous()
    labels[:, :3] = -100
    labels[:, SEQ // 2 : SEQ // 2 + 3] = -100
    return Batch(ids, labels, pos, docs)


def config(directory: str, lora: list[str] | None = None) -> Config:
    model = apply_pretrained(ModelConfig(pretrained=directory))
    if lora:
        model.lora.rank, model.lora.targets = 4, lora
    cfg = Config(model=model)
    cfg.optim.warmup_steps = 0
    return cfg


def train(cfg: Config, comm: Comm, lay: Layout) -> dict:
    """STEPS steps of the global batch at `lay`: each step's loss and gradient norm; then what the
    rank holds and what one micro-batch saves, measured and estimated."""
    mesh = ParallelMesh(lay, "cpu", comm.rank)
    model = build.build_model(cfg, comm, mesh)
    optimizer = build_optimizer(model, cfg.optim)
    runner = StepRunner(model, optimizer, build_scheduler(optimizer, cfg.optim, 10), comm, cfg.optim.grad_clip,
                        counts_data=mesh.position.counts_data, vocab_parallel=mesh.tp is not None)
    rows = global_batch()
    pos = mesh.position
    chunks = rank_micro_batches(list(range(ROWS)), MICRO, pos.dp_size, pos.dp_rank, ROWS // (MICRO * pos.dp_size))
    micro_batches = [Batch(*(t[c] for t in (rows.input_ids, rows.labels, rows.position_ids, rows.document_ids)))
                     for c in chunks]
    steps = []
    for _ in range(STEPS):
        r = runner.step(micro_batches)
        steps.append({"loss": r.loss, "grad_norm": r.grad_norm})
    held, plan = static_bytes(model, optimizer), estimate.static_bytes(cfg.model, lay)
    act = estimate.activation_bytes(cfg.model, lay, SEQ, MICRO, documents=True)
    memory = {"parameters": (held.params, plan.params), "gradients": (held.grads, plan.grads),
              "AdamW state": (held.optimizer, plan.optimizer),
              "activations": (saved_bytes(model, micro_batches[0], mesh.tp is not None), act.total(False))}
    return {"steps": steps, "memory": memory}


def _worker(rank: int, port: int, dirs: dict[str, str], out: str) -> None:
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, 4, rank, "127.0.0.1", port))
    results = {}
    for family in FAMILIES:
        for name, lay in LAYOUTS.items():
            results[f"{family}/{name}"] = train(config(dirs[family]), comm, lay)
    results[f"{LORA[0]}/dp2xtp2"] = train(config(dirs[LORA[1]], LORA[2]), comm, LAYOUTS["dp2xtp2"])
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    comm.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    dirs = {f: str(make_family_model(root / f, f)) for f in FAMILIES}
    out = root / "results.json"
    mp.spawn(_worker, args=(free_port(), dirs, str(out)), nprocs=4)
    got = json.loads(out.read_text())
    single = Layout(1, 1, 1, 1)
    ref = {f: train(config(dirs[f]), one_rank(), single) for f in FAMILIES}
    ref[LORA[0]] = train(config(dirs[LORA[1]], LORA[2]), one_rank(), single)
    return got, ref


def _assert_same(got: dict, ref: dict, what: str) -> None:
    for step, (g, r) in enumerate(zip(got["steps"], ref["steps"]), 1):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-5), f"{what}: step {step} loss"
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-5), f"{what}: step {step} gradient norm"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_trains_the_same_steps_at_every_layout_of_four_ranks(runs, family):
    got, ref = runs
    assert ref[family]["steps"][0]["loss"] != ref[family]["steps"][1]["loss"]  # the second step saw new weights
    for name in LAYOUTS:
        _assert_same(got[f"{family}/{name}"], ref[family], f"{family} at {name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_plans_memory_is_within_ten_percent_of_what_each_layout_holds(runs, family):
    got, _ = runs
    for name in LAYOUTS:
        for what, (measured, estimated) in got[f"{family}/{name}"]["memory"].items():
            assert abs(estimated - measured) <= 0.10 * measured, \
                f"{family} at {name}: {what} estimated {estimated:.0f} B, measured {measured:.0f} B"


def test_lora_adapters_sharded_like_their_base_train_the_same_steps_under_tensor_parallelism(runs):
    got, ref = runs
    _assert_same(got[f"{LORA[0]}/dp2xtp2"], ref[LORA[0]], "qwen2 LoRA at dp2xtp2")
