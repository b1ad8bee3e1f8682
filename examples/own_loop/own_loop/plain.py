"""The loop as its author wrote it: plain PyTorch and FSDP2, nothing from resilient_slurm.

    torchrun --nproc-per-node 2 -m own_loop.plain      (with examples/own_loop on PYTHONPATH)
"""

from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from own_loop.parts import TinyLM, TokenStream


def main(cfg):
    c = cfg.own
    dist.init_process_group("gloo")
    torch.manual_seed(c.seed)
    torch.set_num_threads(c.threads)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = TinyLM(c.vocab, c.hidden, c.layers)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / c.warmup))
    data = TokenStream(c.seed, c.batch, c.seq, c.vocab, dist.get_rank(), dist.get_world_size())
    for step in range(1, c.steps + 1):
        tokens, targets = data.next_batch()
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if dist.get_rank() == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(OmegaConf.load(Path(__file__).parents[1] / "conf" / "own" / "default.yaml"))
