"""Training state as named tensors and JSON, and back: no pickle anywhere.

A rank contributes *pieces*: its own rows of each sharded tensor (FSDP2 holds rows [start, stop) of
dim 0 of every parameter and of its AdamW state, as DTensors), and whole tensors for what every rank
holds alike (a plain model, AdamW's step count). Optimizer state is keyed by parameter name
(`<param fqn>.<state key>`), not by position, so it survives a change of world size or parameter
order. RNG states are JSON (the torch generator's byte state as base64).
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.safetensors_io import DTYPE_NAMES
from resilient_slurm.checkpoint.train_state import TrainState


@dataclass(frozen=True)
class Held:
    """What this rank holds of one tensor of the state."""

    data: torch.Tensor
    """Its rows [start, start + rows) of dim 0 (all of it when not sharded); on any device."""
    spec: layout.TensorSpec
    start: int


@dataclass
class Snapshot:
    """Everything one rank contributes to a checkpoint."""

    model: dict[str, Held]
    optimizer: dict[str, Held]
    rng: dict[str, Any]
    json_files: dict[str, Any] = field(default_factory=dict)
    """Files rank 0 writes (train_state.json, scheduler.json, optimizer.json), by name."""


def capture_snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                     scheduler: torch.optim.lr_scheduler.LRScheduler | None, train_state: TrainState) -> Snapshot:
    """This rank's whole training state, as a checkpoint stores it (tensors by name, the rest JSON).
    Without an optimizer or a scheduler (a user's loop may have neither), their files are left out."""
    names = param_names(model)
    json_files: dict[str, Any] = {layout.TRAIN_STATE: train_state.to_json()}
    if scheduler is not None:
        json_files[layout.SCHEDULER] = scheduler.state_dict()
    if optimizer is not None:
        json_files[layout.OPTIMIZER_META] = optimizer_meta(optimizer, names)
    return Snapshot(
        model=model_tensors(model),
        optimizer=optimizer_tensors(optimizer, names) if optimizer is not None else {},
        rng=capture_rng(),
        json_files=json_files,
    )


def local_rows(t: torch.Tensor, local: torch.Tensor | None = None) -> tuple[int, int]:
    """The rows [start, stop) of the global tensor this rank holds: all of them for a plain tensor.
    `local`: the DTensor's local tensor, when the caller has it already."""
    if not isinstance(t, DTensor):
        return 0, t.shape[0] if t.ndim else 1
    if t.placements != (Shard(0),):
        raise ValueError(f"unsupported placement {t.placements}: checkpoints save FSDP2's Shard(0) only")
    start, stop = layout.shard_rows(t.shape[0], *_mesh_position(t.device_mesh))
    rows = (t.to_local() if local is None else local).shape[0]
    if rows != stop - start:
        raise ValueError(f"FSDP2 holds {rows} rows of a {t.shape[0]}-row tensor here, not "
                         f"{stop - start}: its sharding rule changed, so checkpoints would be wrong")
    return start, stop


@lru_cache(maxsize=16)
def _mesh_position(mesh: DeviceMesh) -> tuple[int, int]:
    """(size, this rank's index) of a 1-D mesh: fixed for the mesh's life, and 30 us to ask."""
    return mesh.size(), mesh.get_local_rank()


def held(t: torch.Tensor, name: str) -> Held:
    """`t` (a DTensor or a plain tensor) as this rank's piece of the tensor `name`.

    Every save calls this for every tensor of the state, in the loop's time: outside autograd and
    asking the DTensor once, it costs 20 us a tensor instead of 330 (measured on a 142M model)."""
    with torch.no_grad():
        local = (t.to_local() if isinstance(t, DTensor) else t).detach()
    start, _ = local_rows(t, local)
    spec = layout.TensorSpec(name, tuple(t.shape), DTYPE_NAMES[t.dtype], local.element_size(), isinstance(t, DTensor))
    return Held(local, spec, start)


def model_tensors(model: nn.Module) -> dict[str, Held]:
    """The model's tensors by HF name, each once (a tied lm_head is left out, as HF does). Frozen
    parameters are not state: they never change, and the run rebuilds them from their source at
    every start (a LoRA run's base model, whose identity its train_state records), so a LoRA
    checkpoint holds the adapters alone."""
    out: dict[str, Held] = {}
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or (isinstance(t, nn.Parameter) and not t.requires_grad):
            continue
        seen.add(id(t))
        out[name] = held(t, name)
    return out


def param_names(model: nn.Module) -> dict[nn.Parameter, str]:
    return {p: name for name, p in model.named_parameters()}


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> dict[str, Held]:
    """Named optimizer tensors in a canonical order (parameter order, then key): every rank must
    derive the same shard plan from it, whatever order the state was created or loaded in."""
    out: dict[str, Held] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"optimizer state {names[p]}.{key} is not a tensor; cannot save without pickle")
                out[f"{names[p]}.{key}"] = held(value, f"{names[p]}.{key}")
    return out


def optimizer_meta(optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> dict[str, Any]:
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
        groups.append({"params": [names[p] for p in group["params"]], **hyper})
    return {"type": type(optimizer).__name__, "param_groups": groups}


def restore_optimizer(
    optimizer: torch.optim.Optimizer,
    names: dict[nn.Parameter, str],
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
) -> None:
    """Install loaded state (this rank's rows of each tensor); the group layout must match the
    current model's. State shaped like its parameter is sharded like it."""
    by_name = {name: p for p, name in names.items()}
    if meta.get("type") != type(optimizer).__name__ or len(meta["param_groups"]) != len(optimizer.param_groups):
        raise ValueError("optimizer.json does not match this optimizer (type or number of groups)")
    for group, saved in zip(optimizer.param_groups, meta["param_groups"]):
        if [names[p] for p in group["params"]] != saved["params"]:
            raise ValueError("optimizer.json lists different parameters than this model has")
        for key, value in saved.items():
            if key != "params":
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    optimizer.state.clear()
    for full_name, tensor in tensors.items():
        pname, key = full_name.rsplit(".", 1)
        if pname not in by_name:
            raise ValueError(f"optimizer state for unknown parameter {pname}")
        p = by_name[pname]
        # AdamW keeps its step count on the CPU, whatever the parameter's device.
        value = tensor if tensor.ndim == 0 else tensor.to(p.device)
        if isinstance(p, DTensor) and tensor.ndim:
            value = DTensor.from_local(value, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        optimizer.state[p][key] = value


def capture_rng() -> dict[str, Any]:
    version, state, gauss = random.getstate()
    np_state: Any = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": {"version": version, "state": list(state), "gauss": gauss},
        "numpy": {"key": np_state[0], "state": np_state[1].tolist(), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(saved: dict[str, Any]) -> None:
    py = saved["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = saved["numpy"]
    np.random.set_state((n["key"], np.array(n["state"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(_unb64(saved["torch"]))
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in saved["cuda"]])


def reseed_rng(seed: int) -> None:
    """Seed every generator `restore_rng` restores, for a rank that has no saved states."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
