"""A Hugging Face model directory (a family of families.py): its config.json as ModelConfig values, and its safetensors weights
read row range by row range.

`HFWeights.read_rows` reads one contiguous byte range of one file with a positioned read, so a rank
that owns rows [start, stop) of every parameter (FSDP2 shards dim 0) reads about 1/world of the
bytes and never holds the full model. No file is memory-mapped whole: on a shared filesystem an
mmap turns into page faults all over a 16 GB file, and its pages count against the job's memory.

Both spellings of the RoPE settings are read: the classic top-level `rope_theta` + `rope_scaling`
(every checkpoint on the Hub, and what the exporter writes) and transformers 5's `rope_parameters`
(which folds `rope_theta` and `rope_type` into one dict; what its `save_pretrained` writes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from resilient_slurm.checkpoint.safetensors_io import FormatError, Header, read_header
from resilient_slurm.config import ModelConfig
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.model.families import PretrainedError, family_of, switches

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
IDENTITY_SAMPLE_BYTES = 4096
"""identity() hashes this many bytes at each end of every tensor's data."""


def read_model_config(directory: str) -> dict[str, Any]:
    """ModelConfig field values from `directory/config.json`, or PretrainedError for anything the
    decoder does not build (another family, biases it lacks, a RoPE scaling other than llama3)."""
    config = _read_json(os.path.join(directory, "config.json"), directory)
    return model_fields(config, directory)


def model_fields(config: Mapping[str, Any], directory: str) -> dict[str, Any]:
    """config.json's contents → ModelConfig field values (`directory` only names it in errors)."""
    family = family_of(config, directory)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise PretrainedError(f"{directory}: hidden_act {act} is not supported; the decoder's MLP uses silu")
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        fields: dict[str, Any] = {
            "name": os.path.basename(os.path.normpath(directory)),
            "vocab_size": int(config["vocab_size"]),
            "hidden_size": hidden,
            "intermediate_size": int(config["intermediate_size"]),
            "num_layers": int(config["num_hidden_layers"]),
            "num_heads": heads,
            "num_kv_heads": int(config.get("num_key_value_heads") or heads),
            "max_seq_len": int(config["max_position_embeddings"]),
            "rms_norm_eps": float(config["rms_norm_eps"]),
        }
    except KeyError as e:
        raise PretrainedError(f"{directory}: config.json lacks {e.args[0]}; it is not a complete "
                              f"{family.architecture} config") from None
    head_dim = config.get("head_dim")
    fields["head_dim"] = int(head_dim) if head_dim and int(head_dim) != hidden // heads else None
    fields["rope_theta"], fields["rope_scaling"] = _rope(config, directory)
    fields["tie_embeddings"] = bool(config.get("tie_word_embeddings", False))
    fields.update(switches(config, family))
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    fields["bos_token_id"] = None if bos is None else int(bos)
    fields["eos_token_id"] = [int(i) for i in eos] if isinstance(eos, list) else [] if eos is None else [int(eos)]
    return fields


def _rope(config: Mapping[str, Any], directory: str) -> tuple[float, dict[str, Any] | None]:
    params = dict(config.get("rope_parameters") or {})
    theta = float(config.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    scaling = dict(config.get("rope_scaling") or params)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise PretrainedError(f"{directory}: rope type {rope_type} is not supported; resilient_slurm supports "
                              "the default RoPE and Llama-3.1's llama3 scaling")
    missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
    if missing:
        raise PretrainedError(f"{directory}: the llama3 rope scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{k: scaling[k] for k in LLAMA3_ROPE_KEYS}}


def apply_pretrained(cfg: ModelConfig) -> ModelConfig:
    """A copy of `cfg` with every dimension from the config.json of `cfg.pretrained` (or, for random
    weights, of `cfg.config`); `cfg` itself when neither is set. The user's dtype,
    activation_checkpointing and init_std stay."""
    source = cfg.pretrained or cfg.config
    if not source:
        return cfg
    directory = os.path.dirname(source) if source.endswith(".json") else source
    return dataclasses.replace(cfg, **read_model_config(directory))


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our model's parameters and shapes (built on the meta device: no memory). A tied lm_head is
    the embedding, so it is not listed."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


class HFWeights:
    """The weights of a Hugging Face directory (`model.safetensors`, or the index and its shards),
    each file's header parsed once; tensors are read by ranges of rows."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        index_path = os.path.join(directory, INDEX_FILE)
        if os.path.isfile(index_path):
            weight_map = _read_json(index_path, directory).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise PretrainedError(f"{index_path}: no weight_map; restore the file from the model's source")
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(os.path.join(directory, SINGLE_FILE)):
            files, weight_map = [SINGLE_FILE], {}
        else:
            raise PretrainedError(f"{directory}: no {SINGLE_FILE} and no {INDEX_FILE}; point model.pretrained at a "
                                  "Hugging Face directory with safetensors weights")
        self.files = files
        self.headers: dict[str, Header] = {}
        self.file_of: dict[str, str] = {}
        for file in files:
            path = os.path.join(directory, file)
            if not os.path.isfile(path):
                raise PretrainedError(f"{directory}: weight file {file} named by {INDEX_FILE} is missing; "
                                      "download it again")
            try:
                self.headers[file] = read_header(path)
            except FormatError as e:
                raise PretrainedError(f"{path}: not a valid safetensors file ({e})") from None
            for name in self.headers[file].tensors:
                self.file_of[name] = file
        for name, file in weight_map.items():
            if self.file_of.get(name) != file:
                raise PretrainedError(f"{directory}: {INDEX_FILE} puts {name} in {file}, which does not hold it")
        self.file_bytes = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
        """Bytes of all weight files together."""
        self.nbytes_read = sum(h.data_start for h in self.headers.values())
        """Bytes read from the weight files so far: the headers, then every read_rows."""

    def names(self) -> list[str]:
        return sorted(self.file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.headers[self._file(name)].tensors[name].shape

    def check(self, expected: Mapping[str, Sequence[int]]) -> None:
        """Every parameter of the model (name → shape, e.g. `expected_shapes(cfg)`) is in the files
        with that shape; a tied `lm_head.weight` may be absent from both."""
        for name, shape in expected.items():
            if name not in self.file_of:
                raise PretrainedError(f"{self.directory}: tensor {name} of the model is in none of the weight "
                                      "files; the checkpoint does not match its config.json")
            found = self.shape(name)
            if found == tuple(shape):
                continue
            if name in ("model.embed_tokens.weight", "lm_head.weight") and found[1:] == tuple(shape[1:]):
                raise PretrainedError(f"{self.directory}: vocabulary mismatch: {name} has {found[0]} rows but the "
                                      f"model config has vocab_size {shape[0]}")
            raise PretrainedError(f"{self.directory}: {name} has shape {list(found)} in the files but "
                                  f"{list(shape)} in the model config")

    def read_rows(self, name: str, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows [start, stop) of dim 0 of tensor `name` into `out` (a contiguous CPU tensor of shape
        (stop - start, *rest)), converted to out's dtype. Reads exactly those bytes, with one pread."""
        info = self.headers[self._file(name)].tensors[name]
        rows = info.shape[0] if info.shape else 1
        if not 0 <= start <= stop <= rows:
            raise PretrainedError(f"{name}: rows [{start}, {stop}) are outside its {rows} rows")
        want = (stop - start, *info.shape[1:])
        if tuple(out.shape) != want or not out.is_contiguous() or out.device.type != "cpu":
            raise PretrainedError(f"{name}: rows [{start}, {stop}) need a contiguous CPU tensor of shape "
                                  f"{list(want)}, got {list(out.shape)} on {out.device}")
        row_bytes = (info.end - info.begin) // rows if rows else 0
        buffer = out if out.dtype == info.dtype else torch.empty(want, dtype=info.dtype)
        view = memoryview(buffer.reshape(-1).view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
        path = os.path.join(self.directory, self._file(name))
        fd = os.open(path, os.O_RDONLY)
        try:
            offset, done = info.begin + start * row_bytes, 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], offset + done)
                if n == 0:
                    raise PretrainedError(f"{path}: ends inside {name}; the file is truncated, download it again")
                done += n
        finally:
            os.close(fd)
        self.nbytes_read += len(view)
        if buffer is not out:
            out.copy_(buffer)

    def read_box(self, name: str, offset: Sequence[int], out: torch.Tensor) -> None:
        """The box of tensor `name` starting at `offset` (one index per dim) with `out`'s shape, into
        `out` (a CPU tensor): its rows read with one pread, then the other dims cut from them."""
        rows = slice(offset[0], offset[0] + out.shape[0]) if out.ndim else slice(0, 1)
        rest = tuple(slice(o, o + n) for o, n in zip(offset[1:], out.shape[1:]))
        whole = self.shape(name)
        if tuple(out.shape[1:]) == tuple(whole[1:]) and out.is_contiguous():
            self.read_rows(name, rows.start, rows.stop, out)
            return
        held = torch.empty((rows.stop - rows.start, *whole[1:]), dtype=out.dtype)
        self.read_rows(name, rows.start, rows.stop, held)
        out.copy_(held[(slice(None),) + rest])

    def _file(self, name: str) -> str:
        file = self.file_of.get(name)
        if file is None:
            raise PretrainedError(f"{self.directory}: no tensor {name} in the weight files")
        return file


def identity(directory: str) -> str:
    """A sha256 naming the base weights, cheap enough for every resume of a 16 GB model.

    Hashed: the index (when sharded), then for each weight file its name, size and header (every
    tensor's name, dtype, shape and offsets), and the first and last IDENTITY_SAMPLE_BYTES of each
    tensor's data: about 2.4 MB read for Llama-3-8B instead of 16 GB (a full sha256 takes a minute
    or more on a shared filesystem, on every resume). A fine-tune or a different release changes
    the start of essentially every tensor, so it changes this hash; an edit confined to the middle
    rows of a tensor would not, which is the price of not reading the whole file."""
    weights = HFWeights(directory)
    digest = hashlib.sha256()
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, "rb") as f:
            digest.update(f.read())
    for file in weights.files:
        path = os.path.join(directory, file)
        header = weights.headers[file]
        digest.update(f"{file}\0{os.path.getsize(path)}\0".encode())
        with open(path, "rb") as f:
            digest.update(f.read(header.data_start))
            for _, info in sorted(header.tensors.items(), key=lambda item: item[1].begin):
                for begin in sorted({info.begin, max(info.begin, info.end - IDENTITY_SAMPLE_BYTES)}):
                    f.seek(begin)
                    digest.update(f.read(min(IDENTITY_SAMPLE_BYTES, info.end - begin)))
    return digest.hexdigest()


def _read_json(path: str, directory: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise PretrainedError(f"{directory}: no {os.path.basename(path)}; point model.pretrained at a Hugging Face "
                              "model directory")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise PretrainedError(f"{path}: not a JSON object")
    return data
