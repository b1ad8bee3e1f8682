"""torch.distributed.checkpoint (DCP) directories read and written box by box, without a process group.

DCP's own `FileSystemReader` and `FileSystemWriter` do all the I/O, driven by planners of ours:
a load planner that asks for any box of any tensor into a plain tensor (DCP intersects it with the
saved chunks, as it does for a DTensor), and a save planner whose write items are given chunks
(each read from its source only when DCP writes it, so memory holds one chunk at a time). The
chunks keep their boxes: a DCP directory written here describes the same chunks as the
checkpoint it came from.

DCP's `.metadata` is a pickle, which DCP's reader loads as it is: convert and load only DCP
directories you trust, as with DCP itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from resilient_slurm.checkpoint import names
from resilient_slurm.checkpoint.chunks import Box, uncovered
from resilient_slurm.checkpoint.names import EMBEDDING, NAMINGS
from resilient_slurm.checkpoint.state import local_box
from resilient_slurm.errors import InputError

METADATA = ".metadata"


class DcpError(InputError):
    """A DCP directory that cannot be used as asked (not one, incomplete, another model's)."""


@dataclass(frozen=True)
class DcpTensor:
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[Box, ...]


def tensors(path: Path) -> dict[str, DcpTensor]:
    """Every tensor of a DCP directory, by its key, with its saved chunks."""
    if not (path / METADATA).is_file():
        raise DcpError(f"{path}: no {METADATA}: not a torch.distributed.checkpoint directory (or its save did not "
                       f"finish); point at the step directory that holds {METADATA}")
    md: Metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return {key: DcpTensor(tuple(m.size), m.properties.dtype,
                           tuple(Box(tuple(c.offsets), tuple(c.sizes)) for c in m.chunks))
            for key, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}


def model_keys(path: Path, found: dict[str, DcpTensor], naming: str | None = None) -> tuple[str, str]:
    """(naming, key prefix) of the model's tensors in a DCP directory, recognised by the embedding:
    `tok_embeddings.weight` at the top (torchtitan), `model.embed_tokens.weight` (ours, Hugging
    Face's), either one under a prefix (`model.` when a loop saved {"model": state_dict})."""
    for candidate in ([naming] if naming else NAMINGS):
        assert candidate is not None
        prefixes = sorted((k[: -len(EMBEDDING[candidate])] for k in found
                           if k.endswith(EMBEDDING[candidate]) and k[: -len(EMBEDDING[candidate])][-1:] in ("", ".")),
                          key=len)
        if prefixes:
            return candidate, prefixes[0]
    wanted = " or ".join(EMBEDDING[n] for n in ([naming] if naming else NAMINGS))
    some = ", ".join(sorted(found)[:4]) or "none"
    raise DcpError(f"{path}: no {wanted} among its tensors ({some}, ...): not a Llama checkpoint with these names"
                   + ("; try --names " + " or ".join(n for n in NAMINGS if n != naming) if naming else ""))


def read_boxes(path: Path, found: dict[str, DcpTensor], wanted: list[tuple[str, Box, torch.Tensor]]) -> None:
    """Fill each (key, box, dest) with that box of the tensor, dest a CPU tensor of the box's shape
    and the saved dtype. DcpError naming the tensor and region when no saved chunk holds part of it."""
    for key, box, dest in wanted:
        t = found.get(key)
        if t is None:
            raise DcpError(f"{path}: no tensor {key!r}; the model needs it")
        if len(box.offsets) != len(t.shape) or any(e > n for e, n in zip(box.ends, t.shape)) or dest.dtype != t.dtype:
            raise DcpError(f"{path}: tensor {key!r} is {t.dtype}{list(t.shape)}, the model needs {box.describe()} of "
                           f"it as {dest.dtype}: another model's checkpoint?")
        missing = uncovered(box, list(t.chunks))
        if missing is not None:
            raise incomplete(path, key, f"no chunk holds {missing.describe()}")
    if wanted:
        with _single_process():
            dcp.load({}, storage_reader=dcp.FileSystemReader(str(path)), planner=_BoxLoader(wanted), no_dist=True)


def incomplete(path: Path, key: str, gap: str) -> DcpError:
    return DcpError(f"{path}: tensor {key!r}: {gap}: the checkpoint is incomplete (saved by only some of its "
                    f"ranks?) or not one save; use a complete one")


class _BoxLoader(DefaultLoadPlanner):
    def __init__(self, wanted: list[tuple[str, Box, torch.Tensor]]) -> None:
        super().__init__(flatten_state_dict=False)
        self.wanted = {(key, box.offsets): dest for key, box, dest in wanted}
        self.boxes = [(key, box) for key, box, _ in wanted]

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for key, box in self.boxes:
            md = self.metadata.state_dict_metadata[key]  # type: ignore[union-attr]
            assert isinstance(md, TensorStorageMetadata)
            items += create_read_items_for_chunk_list(
                key, md, [ChunkStorageMetadata(torch.Size(box.offsets), torch.Size(box.lengths))])
        return LoadPlan(items)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        view = self.wanted[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset or ()))]
        for d, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(d, offset, length)
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # read straight into the destination's view


Source = Callable[[], torch.Tensor]
"""Reads one chunk (contiguous, on the CPU) when DCP writes it."""


def write_chunks(path: Path, items: list[tuple[str, tuple[int, ...], torch.dtype, Box, Source]], threads: int = 1) -> None:
    """A DCP directory holding each (key, global shape, dtype, box, source) chunk, written by DCP's
    FileSystemWriter; every tensor's chunks must tile it (DCP checks)."""
    writer = dcp.FileSystemWriter(str(path), thread_count=threads, sync_files=True)
    with _single_process():
        dcp.save({}, storage_writer=writer, planner=_ChunkSaver(items), no_dist=True)


@contextmanager
def _single_process() -> Iterator[None]:
    """DCP warns that it runs in one process, which is what these calls ask for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class _ChunkSaver(DefaultSavePlanner):
    def __init__(self, items: list[tuple[str, tuple[int, ...], torch.dtype, Box, Source]]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.items = items
        self.sources = {(key, box.offsets): read for key, _, _, box, read in items}

    def create_local_plan(self) -> SavePlan:
        self.plan = SavePlan([
            WriteItem(index=MetadataIndex(key, torch.Size(box.offsets)), type=WriteItemType.SHARD,
                      tensor_data=TensorWriteData(ChunkStorageMetadata(torch.Size(box.offsets), torch.Size(box.lengths)),
                                                  TensorProperties(dtype=dtype), torch.Size(shape)))
            for key, shape, dtype, box, _ in self.items])
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        return self.sources[(write_item.index.fqn, tuple(write_item.index.offset or ()))]()


def rotary_to_hf(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of whole heads in torchtitan's (interleaved) order, in Hugging Face's (halves)."""
    return t.reshape(-1, head_dim // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()


def rotary_to_torchtitan(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    return t.reshape(-1, 2, head_dim // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()


def fill_model(model: nn.Module, path: Path, heads: int, kv_heads: int) -> str:
    """Write this rank's part of every parameter of `model` (DTensors at any placement, or plain
    tensors) from DCP directory `path`, reading only that part; returns the naming recognised.
    DcpError, one line, for a missing tensor, another shape or an incomplete checkpoint."""
    found = tensors(path)
    naming, prefix = model_keys(path, found)
    wanted: list[tuple[str, Box, torch.Tensor]] = []
    after: list[tuple[torch.Tensor, torch.Tensor, int, Box, Box]] = []
    for name, p in model.named_parameters():
        key = names.rename(name, naming, to_ours=False)
        if key is None:
            raise DcpError(f"{path}: the model's {name} has no name among torchtitan's Llama-3 tensors")
        key = prefix + key
        box = local_box(p)
        local = p.to_local() if isinstance(p, DTensor) else p
        saved = found.get(key)
        if saved is None or saved.shape != tuple(p.shape):
            raise DcpError(f"{path}: the model needs {key} as {list(p.shape)}, the checkpoint has "
                           f"{'none' if saved is None else list(saved.shape)}: another model's weights, or set the "
                           f"model's dimensions (model.config) to its")
        kind = names.rotary(name) if naming == "torchtitan" else None
        if kind is not None:
            head_dim = p.shape[0] // (heads if kind == "q" else kv_heads)
            read_as = names.whole_heads(box, head_dim)
        else:
            head_dim, read_as = 0, box
        direct = kind is None and local.device.type == "cpu" and local.is_contiguous() and local.dtype == saved.dtype
        dest = local.data if direct else torch.empty(read_as.lengths, dtype=saved.dtype)
        wanted.append((key, read_as, dest))
        if not direct:
            after.append((local, dest, head_dim, box, read_as))
    read_boxes(path, found, wanted)
    with torch.no_grad():
        for local, dest, head_dim, box, read_as in after:
            if head_dim:
                start = box.offsets[0] - read_as.offsets[0]
                dest = rotary_to_hf(dest, head_dim)[start : start + box.lengths[0]]
            local.copy_(dest)
    return naming
