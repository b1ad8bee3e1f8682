"""What in-training monitoring costs per step, on the tiny_sft model (target: <= 1% of a step).

    python bench/monitor.py [--steps 600] [--blocks 12]

Two measurements, both in one process:
- the monitoring work itself, timed call by call: detectors (`Monitor.observe`), the watchdog
  heartbeat and the copy of the latest GPU sample, against the median training step;
- the whole step with monitoring on and off, in alternating blocks (this machine is noisy, so
  the end-to-end difference has a wide spread; the per-call figure is the precise one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.config import Config  # noqa: E402
from resilient_slurm.exit_codes import ExitCode  # noqa: E402
from resilient_slurm.ledger import EventLog  # noqa: E402
from resilient_slurm.monitor.detectors import Monitor, Observation  # noqa: E402
from resilient_slurm.monitor.gpu_sampler import GpuSampler  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.parallel.fsdp import build_model, fill_random  # noqa: E402
from resilient_slurm.trainer.step import StepRunner  # noqa: E402
from resilient_slurm.session.watchdog import Watchdog  # noqa: E402
from resilient_slurm.data.batches import PackedBatchSampler  # noqa: E402
from resilient_slurm.data.chat.dataset import open_chat_data  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--blocks", type=int, default=12)
    args = parser.parse_args()
    cfg = Config()  # the tiny_sft model, data and batch: d=256, 4 layers, 8 x 128 tokens
    torch.set_num_threads(2)
    comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", 0))
    model = build_model(cfg.model, comm.mesh, comm.device)
    fill_random(model, cfg.model, 0)
    logs = Path(tempfile.mkdtemp(prefix="bench-monitor-"))
    data = open_chat_data(cfg.data, cfg.data.tokenizer, str(logs / "cache"))
    opt = build_optimizer(model, cfg.optim)
    trainer = StepRunner(model, opt, build_scheduler(opt, cfg.optim, 10_000), comm, 1.0)
    sampler = PackedBatchSampler(data.train, cfg.data, 0, 0, 1)
    monitor = Monitor(cfg.monitor)
    watchdog = Watchdog(cfg.monitor, logs, EventLog(logs / "events.jsonl"), 0, lambda s, r: None, ExitCode.FAILED)
    gpu = GpuSampler(0, cfg.monitor.gpu_sample_s)
    gpu.start()

    steps: dict[bool, list[float]] = {True: [], False: []}
    monitor_cost: list[float] = []
    step = 0
    for block in range(args.blocks):
        on = block % 2 == 0
        for _ in range(args.steps // args.blocks):
            step += 1
            start = time.perf_counter()
            result = trainer.step(sampler.next_batch())
            step_s = time.perf_counter() - start
            if on:
                t = time.perf_counter()
                obs = Observation(step, result.loss, result.grad_norm, result.tokens / step_s, 8 / step_s,
                                  (result.compute_s,), (0.0,), dict(gpu.latest))
                monitor.observe(obs)
                watchdog.beat(step, step_s)
                monitor_cost.append(time.perf_counter() - t)
            steps[on].append(time.perf_counter() - start)
    gpu.stop()

    med = statistics.median
    step_med = med(steps[False])
    cost = med(monitor_cost)
    print("| measure | value |\n|---|---|")
    print(f"| training step, monitoring off (median of {len(steps[False])}) | {step_med * 1e3:.1f} ms |")
    print(f"| training step, monitoring on (median of {len(steps[True])}) | {med(steps[True]) * 1e3:.1f} ms |")
    print(f"| monitoring work per step (median; p90) | {cost * 1e6:.0f} us; "
          f"{statistics.quantiles(monitor_cost, n=10)[-1] * 1e6:.0f} us |")
    print(f"| monitoring work / step | {cost / step_med:.3%} |")
    print(f"| end-to-end difference on - off (noisy) | {(med(steps[True]) - step_med) / step_med:+.1%} |")
    print(f"\ntarget <= 1% of step time: {'met' if cost / step_med <= 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
