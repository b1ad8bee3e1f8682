"""What the out-of-memory agreement points cost per step: 2 ranks, gloo, CPU, the tiny_sft model.

    python bench/oom_guard.py [--blocks 6] [--steps 10] [--micro 4]

Every FSDP2 unit gets three agreement points per micro-batch (trainer/oom.py), each one host-side
all-reduce of one integer. Measured in the same two processes, alternating blocks of steps with a
guarded trainer and one whose guard has no agreement points (the step's own end-of-loop count stays),
on two identical models fed the same batches; medians over all steps of each kind. Also the cost of
one count alone. Holds for gloo between processes of one machine; with NCCL the counts go over a
gloo group beside it, between machines over TCP, and cost more each.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.config import Config  # noqa: E402
from resilient_slurm.trainer import step as step_module  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.oom import OomGuard  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.parallel.fsdp import build_model, fill_random  # noqa: E402
from resilient_slurm.trainer.step import StepRunner  # noqa: E402
from resilient_slurm.data.batches import Batch  # noqa: E402


class Unguarded(OomGuard):
    """The guard without its agreement points."""

    def __init__(self, model: torch.nn.Module, comm: Comm) -> None:
        self.model, self.comm = model, comm


def _trainer(cfg: Config, comm: Comm, guarded: bool) -> StepRunner:
    model = build_model(cfg.model, comm.mesh, comm.device)
    fill_random(model, cfg.model, 0)
    optimizer = build_optimizer(model, cfg.optim)
    step_module.OomGuard = OomGuard if guarded else Unguarded  # type: ignore[misc]
    return StepRunner(model, optimizer, build_scheduler(optimizer, cfg.optim, 10**6), comm, cfg.optim.grad_clip)


def _rank(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    torch.set_num_threads(1)
    cfg = Config()
    comm = Comm(RankInfo(rank, 2, rank, "127.0.0.1", port))
    counts = 0
    count = comm.count

    def counted(flag: bool) -> int:
        nonlocal counts
        counts += 1
        return count(flag)

    comm.count = counted  # type: ignore[method-assign]
    trainers = {"guarded": _trainer(cfg, comm, True), "unguarded": _trainer(cfg, comm, False)}
    rows = cfg.data.global_batch_size // 2
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, cfg.model.vocab_size, (rows, cfg.data.seq_len + 1), generator=g)
    s = cfg.data.seq_len
    batches = [Batch(ids[i:i + args.micro, :-1], ids[i:i + args.micro, 1:], torch.arange(s).expand(args.micro, s),
                     torch.zeros(args.micro, s, dtype=torch.long)) for i in range(0, rows, args.micro)]
    times: dict[str, list[float]] = {k: [] for k in trainers}
    per_step: dict[str, int] = {}
    for block in range(args.blocks):
        for name in (("guarded", "unguarded") if block % 2 == 0 else ("unguarded", "guarded")):
            before = counts
            for _ in range(args.steps):
                start = time.perf_counter()
                trainers[name].step(batches)
                times[name].append(time.perf_counter() - start)
            per_step[name] = (counts - before) // args.steps
    single = []
    for _ in range(2000):
        start = time.perf_counter()
        count(False)
        single.append(time.perf_counter() - start)
    if rank == 0:
        out.update(times=times, per_step=per_step, count_us=statistics.median(single) * 1e6)
    comm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch (4 = one per rank and step)")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(port, args, out), nprocs=2, join=True)
        result = dict(out)
    cfg = Config()
    print(f"model d={cfg.model.hidden_size}, {cfg.model.num_layers} layers; {cfg.data.global_batch_size // 2} rows x "
          f"{cfg.data.seq_len} tokens per rank, micro-batch {args.micro}; {args.blocks} alternating blocks of "
          f"{args.steps} steps; 2 ranks, gloo, 1 thread each")
    print(f"{'trainer':<10} {'counts/step':>11} {'median step ms':>15} {'p10 ms':>8} {'p90 ms':>8}")
    for name, samples in result["times"].items():
        q = statistics.quantiles(samples, n=10)
        print(f"{name:<10} {result['per_step'][name]:>11} {statistics.median(samples) * 1e3:>15.2f} "
              f"{q[0] * 1e3:>8.2f} {q[-1] * 1e3:>8.2f}")
    on, off = (statistics.median(result["times"][k]) for k in ("guarded", "unguarded"))
    print(f"overhead: {(on - off) * 1e3:+.2f} ms per step ({(on / off - 1) * 100:+.1f}%); one count alone: "
          f"{result['count_us']:.0f} us (median of 2000)")


if __name__ == "__main__":
    main()
