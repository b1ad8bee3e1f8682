"""The same loop with a resilient_slurm Session: emergency saves on USR1/USR2/TERM, exact resume,
requeue, restarts on spare nodes, the ledger and tracking. Launch it with:

    python -m resilient_slurm.launch entry=own_loop.train:main +own=default \
        --config-dir examples/own_loop/conf [cluster.ranks=2 | cluster=slurm ...]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from own_loop.parts import TinyLM, TokenStream
from resilient_slurm.api import Session


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
    with Session.from_env(model, opt, sched, data) as s:
        s.resume()
        for step in s.steps(c.steps):
            tokens, targets = data.next_batch()
            loss = model(tokens, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            s.log(step, loss=loss.item(), tokens=c.batch * c.seq)
            if s.end_of_step(step):
                break
    dist.destroy_process_group()
