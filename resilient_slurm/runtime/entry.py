"""`entry=MODULE:FUNCTION`: a user's own training function, run as a rank of the run.

The launcher, the Slurm task and the driver run it exactly where they would run the built-in
trainer, so it gets the same signals, requeue, in-allocation restarts, health watch and exclude
list. The function receives the composed config (a DictConfig: the project's keys and the user's
own side by side) and makes a `Session`, which takes this rank's context from here. torchrun-style
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) are set for a loop that makes its
own process group with `init_process_group()`.

Python's `random` and numpy's global generator seed themselves from the OS at process start, so two
runs of the same function would differ: they are seeded here from `train.seed` and the rank, before
the function runs, and whatever seeding the function does itself comes after and stands. torch's
generators are left alone (torch starts from a fixed seed; a loop's `torch.manual_seed` is its own).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
import os
import random
import socket
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from resilient_slurm.config import Config, to_dict
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.session.distributed import RankInfo
from resilient_slurm.errors import InputError
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.session.context import RankContext, RunOutcome, launched
from resilient_slurm.process.signals import StopRequest


def resolve(spec: str) -> Callable[[DictConfig], Any]:
    """`my_pkg.train:main` -> the function; InputError naming what is missing otherwise."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"entry: {spec!r} is not MODULE:FUNCTION; write it like entry=my_pkg.train:main")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(f"entry: cannot import {module_name!r} ({e}); install it or put it on PYTHONPATH") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"entry: {module_name} has no function {attr!r}; name one it defines")
    return fn


def user_config(cfg: Config) -> DictConfig:
    """What the function gets: the project's sections and the user's own keys at the top level, as
    Hydra composed them."""
    ours = to_dict(cfg)
    theirs = ours.pop("user")
    composed = OmegaConf.create({**ours, **theirs})
    assert isinstance(composed, DictConfig)
    return composed


def run_entry(cfg: Config, run_dir: Path, info: RankInfo, context: dict[str, Any], stop: StopRequest,
              on_hang: Callable[[int, str], None] | None) -> RunOutcome:
    """Call the function with this rank's context installed; how its session ended, else how the
    function did. Bad input (and an entry that cannot be imported) ends with exit status 2."""
    fn = resolve(cfg.entry)
    port = info.master_port or _free_port()
    # For a loop that calls init_process_group() itself; what the supervisor said besides stays.
    os.environ.update(replace(RankLaunch.from_env(os.environ), run_dir=str(run_dir), rank=info.rank,
                              world_size=info.world_size, local_rank=info.local_rank,
                              local_world_size=info.local_world_size, master_addr=info.master_addr,
                              master_port=port).to_env())
    ctx = RankContext(cfg, run_dir, replace(info, master_port=port), stop, context, on_hang)
    code: int = ExitCode.DONE
    seed_host_generators(cfg.train.seed, info.rank)
    with launched(ctx):
        try:
            fn(user_config(cfg))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else ExitCode.FAILED
        except Exception:
            if not ctx.outcomes:
                raise  # it failed before its session: the caller records it
    if ctx.outcomes:
        return ctx.outcomes[0]
    known = code in {int(c) for c in ExitCode}
    return RunOutcome(ExitCode(code) if known else ExitCode.FAILED, None,
                      error=None if code == ExitCode.DONE else f"entry {cfg.entry} exited with {code}")


def seed_host_generators(seed: int, rank: int) -> None:
    """Python's and numpy's global generators, seeded apart on each rank; torch's are not touched."""
    value = zlib.crc32(f"{seed}:{rank}".encode())
    random.seed(value)
    np.random.seed(value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
