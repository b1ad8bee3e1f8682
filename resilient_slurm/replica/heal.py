"""A replica group's whole training state as one payload for a peer, and its installation there.

The payload is what a checkpoint holds of a rank (`checkpoint.state.capture_snapshot`): the model's
and optimizer's tensors as this rank holds them (its local shards, by name), the scheduler, the
RNG states, and train_state.json's fields (step, tokens, seconds, the data position). A healing
rank has the same place in its group as the rank that sends (group rank r heals from group rank r
of a live group), so each tensor is copied into its own shard as it is: no resharding, no file.

The live rank serves its tensors as they are, without a copy: nothing changes them before the
step's commit, and the healing rank has fetched them by then (it must join the step's reduction,
which the live rank waits in before it commits).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.state import (
    Snapshot,
    optimizer_meta,
    param_names,
    restore_optimizer,
    restore_rng,
)
from resilient_slurm.checkpoint.train_state import TrainState

MODEL, OPTIMIZER, META = "model", "optimizer", "meta"


def payload(snap: Snapshot) -> dict[str, Any]:
    """What a live rank sends: its tensors by name (references, not copies) and the rest as JSON."""
    meta = {"json_files": snap.json_files, "rng": snap.rng, "optimizer_type": snap.optimizer_type,
            "groups": [[list(g.params), g.hyper] for g in snap.groups]}
    return {MODEL: {name: h.data for name, h in snap.model.items()},
            OPTIMIZER: {name: h.data for name, h in snap.optimizer.items()},
            META: json.dumps(meta)}


def payload_bytes(received: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for part in (MODEL, OPTIMIZER) for t in received[part].values())


@dataclass(frozen=True)
class Installed:
    train_state: TrainState
    bytes: int


def install(received: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None,
            scheduler: torch.optim.lr_scheduler.LRScheduler | None) -> Installed:
    """Copy a live rank's payload into this rank's training objects; its train state, for the
    caller's own position (progress, data). Raises ValueError when the payload does not fit (another
    model or layout: the groups must be built alike)."""
    meta = json.loads(received[META])
    tensors = received[MODEL]
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if name not in tensors:
                continue  # frozen (a LoRA base, rebuilt from its source), or a tied copy
            mine = t.to_local() if isinstance(t, DTensor) else t
            theirs = tensors[name]
            if tuple(mine.shape) != tuple(theirs.shape):
                raise ValueError(f"heal: {name} is {list(theirs.shape)} at the live group and {list(mine.shape)} here: "
                                 f"the groups are not laid out alike")
            mine.copy_(theirs)
    if optimizer is not None and meta["optimizer_type"] is not None:
        groups = [(tuple(params), hyper) for params, hyper in meta["groups"]]
        restore_optimizer(optimizer, param_names(model), optimizer_meta(groups, meta["optimizer_type"]),
                          received[OPTIMIZER])
    files = meta["json_files"]
    if scheduler is not None and layout.SCHEDULER in files:
        scheduler.load_state_dict(files[layout.SCHEDULER])
    restore_rng(meta["rng"])
    return Installed(TrainState.from_json(files[layout.TRAIN_STATE]), payload_bytes(received))
