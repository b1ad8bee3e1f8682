"""Training state as named tensors and JSON, and back: no pickle anywhere.

A rank contributes the *box* it holds of each tensor (global offsets and lengths per dimension):
a DTensor's local shard, wherever its placements put it (FSDP2's Shard(0), tensor parallelism's
Shard(d), Replicate, FSDP2 over TP's strided shard, on meshes of any dimension), and the whole
tensor for a plain one (a plain model, AdamW's step count). With each box goes what lets any rank
work out any holder's box (`plan.Entry`: the mesh and placements). Optimizer state is keyed by
parameter name (`<param fqn>.<state key>`), not by position, so it survives a change of layout or
parameter order. RNG states are JSON (the torch generator's byte state as base64).
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
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from resilient_slurm.checkpoint import chunks, layout
from resilient_slurm.checkpoint.chunks import Box
from resilient_slurm.checkpoint.plan import Mesh
from resilient_slurm.checkpoint.safetensors_io import DTYPE_NAMES
from resilient_slurm.checkpoint.train_state import TrainState


@dataclass(frozen=True)
class Held:
    """What this rank holds of one tensor of the state."""

    data: torch.Tensor
    """Its box of the tensor (all of it for a plain tensor); on any device."""
    spec: layout.TensorSpec
    box: Box
    placed: tuple[Mesh, tuple[chunks.Placement, ...]] | None = None
    """A DTensor's mesh and placements; None for a plain tensor."""


@dataclass(frozen=True)
class OptimizerGroup:
    params: tuple[str, ...]
    """Its parameters' names."""
    hyper: dict[str, Any]
    """Its hyper-parameters (lr, betas, ...), JSON."""


@dataclass
class Snapshot:
    """Everything one rank contributes to a checkpoint."""

    model: dict[str, Held]
    optimizer: dict[str, Held]
    rng: dict[str, Any]
    json_files: dict[str, Any] = field(default_factory=dict)
    """Files rank 0 writes (train_state.json, scheduler.json), by name."""
    groups: tuple[OptimizerGroup, ...] = ()
    """This rank's optimizer's param groups: optimizer.json is made of every rank's (ranks of
    different pipeline stages hold different parameters)."""
    optimizer_type: str | None = None
    """The optimizer's class name; None: no optimizer (no optimizer.json)."""


def capture_snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                     scheduler: torch.optim.lr_scheduler.LRScheduler | None, train_state: TrainState) -> Snapshot:
    """This rank's whole training state, as a checkpoint stores it (tensors by name, the rest JSON).
    Without an optimizer or a scheduler (a user's loop may have neither), their files are left out."""
    names = param_names(model)
    json_files: dict[str, Any] = {layout.TRAIN_STATE: train_state.to_json()}
    if scheduler is not None:
        json_files[layout.SCHEDULER] = scheduler.state_dict()
    return Snapshot(
        model=model_tensors(model),
        optimizer=optimizer_tensors(optimizer, names) if optimizer is not None else {},
        rng=capture_rng(),
        json_files=json_files,
        groups=optimizer_groups(optimizer, names) if optimizer is not None else (),
        optimizer_type=type(optimizer).__name__ if optimizer is not None else None,
    )


def local_box(t: torch.Tensor, local: torch.Tensor | None = None) -> Box:
    """The box of the global tensor this rank holds: all of it for a plain tensor. `local`: the
    DTensor's local tensor, when the caller has it already. ValueError for a placement no box
    describes (Partial, a strided shard after a plain one)."""
    if not isinstance(t, DTensor):
        return chunks.whole(tuple(t.shape))
    return _dtensor(t, local)[0]


def local_rows(t: torch.Tensor, local: torch.Tensor | None = None) -> tuple[int, int]:
    """The rows [start, stop) of the global tensor this rank holds, for a tensor cut along dim 0
    only (FSDP2's Shard(0)): all of them for a plain tensor; ValueError for other cuts."""
    box = local_box(t, local)
    if not box.lengths:
        return 0, 1
    if box.lengths[1:] != tuple(t.shape[1:]):
        raise ValueError(f"this rank holds {box.describe()} of a {list(t.shape)} tensor: not whole rows")
    return box.offsets[0], box.offsets[0] + box.lengths[0]


def _dtensor(t: DTensor, local: torch.Tensor | None) -> tuple[Box, Mesh, tuple[chunks.Placement, ...]]:
    mesh, coord = _mesh(t.device_mesh)
    placements = _placements(t.placements)
    box = _box(tuple(t.shape), mesh, coord, placements)
    held_shape = tuple((t.to_local() if local is None else local).shape)
    if held_shape != box.lengths:
        raise ValueError(f"this rank holds a {list(held_shape)} piece of a {list(t.shape)} tensor placed "
                         f"{t.placements}, not the {list(box.lengths)} its placements give: checkpoints would be wrong")
    return box, mesh, placements


@lru_cache(maxsize=16)
def _mesh(mesh: DeviceMesh) -> tuple[Mesh, tuple[int, ...]]:
    """The mesh as plain ranks, and this rank's coordinate: fixed for the mesh's life (and slow to ask)."""
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError("a DTensor on a mesh this rank is not part of")
    return Mesh(tuple(mesh.shape), tuple(mesh.mesh.flatten().tolist())), tuple(coord)


@lru_cache(maxsize=256)
def _placements(placements: tuple[Placement, ...]) -> tuple[chunks.Placement, ...]:
    out: list[chunks.Placement] = []
    for p in placements:
        if isinstance(p, _StridedShard):
            out.append(("SS", p.dim, p.split_factor))
        elif isinstance(p, Shard):
            out.append(("S", p.dim))
        elif isinstance(p, Replicate):
            out.append(("R",))
        else:
            raise ValueError(f"unsupported placement {p}: checkpoints save Shard, Replicate and FSDP2's strided "
                             f"shard (a Partial tensor is a pending reduction; reduce it first)")
    return tuple(out)


@lru_cache(maxsize=4096)
def _box(shape: tuple[int, ...], mesh: Mesh, coord: tuple[int, ...], placements: tuple[chunks.Placement, ...]) -> Box:
    try:
        return chunks.shard_box(shape, mesh.shape, coord, placements)
    except chunks.ChunkError as e:
        raise ValueError(str(e)) from None


def held(t: torch.Tensor, name: str) -> Held:
    """`t` (a DTensor or a plain tensor) as this rank's box of the tensor `name`.

    Every save calls this for every tensor of the state, in the loop's time: outside autograd and
    asking the DTensor once (its mesh and placements cached), it stays at tens of microseconds."""
    with torch.no_grad():
        local = (t.to_local() if isinstance(t, DTensor) else t).detach()
    spec = layout.TensorSpec(name, tuple(t.shape), DTYPE_NAMES[t.dtype], local.element_size())
    if not isinstance(t, DTensor):
        return Held(local, spec, chunks.whole(spec.shape))
    box, mesh, placements = _dtensor(t, local)
    return Held(local, spec, box, (mesh, placements))


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


def optimizer_groups(optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> tuple[OptimizerGroup, ...]:
    return tuple(OptimizerGroup(tuple(names[p] for p in group["params"]),
                                {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"})
                 for group in optimizer.param_groups)


def restore_optimizer(
    optimizer: torch.optim.Optimizer,
    names: dict[nn.Parameter, str],
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
) -> None:
    """Install loaded state (this rank's box of each tensor). optimizer.json's groups are every
    rank's (another layout may have cut them differently: pipeline stages): each group of this
    optimizer takes the hyper-parameters of the saved groups its parameters were in, which must
    agree. State shaped like its parameter is placed like it."""
    by_name = {name: p for p, name in names.items()}
    if meta.get("type") != type(optimizer).__name__:
        raise ValueError(f"optimizer.json is for {meta.get('type')}, not this {type(optimizer).__name__}")
    saved_in = {name: i for i, g in enumerate(meta["param_groups"]) for name in g["params"]}
    for group in optimizer.param_groups:
        found = set()
        for p in group["params"]:
            if names[p] not in saved_in:
                raise ValueError(f"optimizer.json has no param group with {names[p]}: this model has parameters "
                                 f"the saved optimizer did not")
            found.add(saved_in[names[p]])
        hypers = [{k: v for k, v in meta["param_groups"][i].items() if k != "params"} for i in sorted(found)]
        if any(h != hypers[0] for h in hypers[1:]):
            raise ValueError(f"optimizer.json: the parameters of one group here were in groups with different "
                             f"hyper-parameters: {hypers[0]} and {next(h for h in hypers if h != hypers[0])}")
        for key, value in (hypers[0] if hypers else {}).items():
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


def optimizer_meta(plan_groups: list[tuple[tuple[str, ...], dict[str, Any]]], optimizer_type: str) -> dict[str, Any]:
    """optimizer.json: the type and every distinct param group of the ranks."""
    return {"type": optimizer_type, "param_groups": [{"params": list(params), **hyper} for params, hyper in plan_groups]}


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
