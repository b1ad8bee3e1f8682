"""Training loops of a user's own for the Session tests: the example's, and smaller variants of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tests.integration.runs import REPO

EXAMPLE = REPO / "examples" / "own_loop"
BASE = ["--config-dir", str(EXAMPLE / "conf"), "+own=default", "own.steps=120", "tracking.mode=disabled"]


def launch_own(root: Path, name: str, *overrides: str, entry: str = "own_loop.train:main") -> subprocess.Popen:
    """`python -m resilient_slurm.launch entry=...` in its own session, the example on PYTHONPATH."""
    path = os.pathsep.join([str(EXAMPLE), str(REPO), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "resilient_slurm.launch", *BASE, f"entry={entry}", f"run.root={root}",
         f"run.name={name}", *overrides],
        cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path),
    )


def own_dir(root: Path, name: str) -> Path:
    return root / "own_loop" / name


def _model_and_optimizer(c, mesh):  # noqa: ANN001, ANN202 - the example's config node
    from own_loop.parts import TinyLM

    torch.manual_seed(c.seed)
    model = TinyLM(c.vocab, c.hidden, c.layers)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=c.lr)


def no_scheduler_no_data_state(cfg) -> None:  # noqa: ANN001
    """A loop with neither a scheduler nor a data position; its own process group."""
    from own_loop.parts import TokenStream
    from resilient_slurm.api import Session

    c = cfg.own
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, opt = _model_and_optimizer(c, mesh)
    data = TokenStream(c.seed, c.batch, c.seq, c.vocab, dist.get_rank(), dist.get_world_size())
    with Session.from_env(model, opt) as s:
        resumed = s.resume()
        data.position = resumed.step if resumed else 0  # the loop keeps its own position
        for step in s.steps(c.steps):
            loss = model(*data.next_batch())
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log(step, loss=loss.item())
            if s.end_of_step(step):
                break
    dist.destroy_process_group()


def session_makes_the_group(cfg) -> None:  # noqa: ANN001
    """A one-rank loop that leaves the process group to the Session and keeps its data position in a dict."""
    from own_loop.parts import TokenStream
    from resilient_slurm.api import Session

    c = cfg.own
    position = {"batches": 0}
    with Session.from_env(*_mesh_free_model(c), data_state=position) as s:
        s.resume()
        data = TokenStream(c.seed, c.batch, c.seq, c.vocab, s.rank, s.world_size)
        for step in s.steps(c.steps):
            data.position = position["batches"]
            loss = s.model(*data.next_batch())
            loss.backward()
            s.optimizer.step()
            s.optimizer.zero_grad()
            position["batches"] += 1
            s.log(step, loss=loss.item())
            if s.end_of_step(step):
                break


def _mesh_free_model(c):  # noqa: ANN001, ANN202
    """The model without FSDP2: the loop runs on one rank, in the group the Session makes."""
    from own_loop.parts import TinyLM

    torch.manual_seed(c.seed)
    model = TinyLM(c.vocab, c.hidden, c.layers)
    return model, torch.optim.AdamW(model.parameters(), lr=c.lr)
