"""A LoRA run's adapters written out: as a PEFT adapter directory, or folded into its base model.

The adapter directory is tiny (the adapters alone, float32 by default, as peft saves them), so it
is written whole. The merged model streams like any export (`hf_writer`): each base weight is read
from the base as the run held it (bfloat16: what the adapters were trained against), and an adapted
weight becomes W + alpha/rank * B @ A in float32 before it is converted to the export dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from resilient_slurm.checkpoint.safetensors_io import write_file
from resilient_slurm.config import Config
from resilient_slurm.export.hf_layout import SAFETENSORS_METADATA
from resilient_slurm.export.hf_writer import ExportError, copy_tokenizer, staged_directory, write_json
from resilient_slurm.export.peft_layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapted_weights,
    adapter_config,
    peft_name,
)
from resilient_slurm.model.lora import BASE_DTYPE, is_adapter, merged_weight
from resilient_slurm.model.decoder import init_value
from resilient_slurm.model.pretrained import HFWeights, PretrainedError

Read = Callable[[str], torch.Tensor]


def write_adapter(out_dir: str, names: Sequence[str], read: Read, cfg: Config, dtype: torch.dtype,
                  tokenizer_dir: str | None) -> None:
    """The adapters `names` (read whole by `read`) as a PEFT directory at `out_dir`, a new directory.
    The tokenizer the run used travels with it when it is not the base's (vLLM then uses it)."""
    if not names or not all(is_adapter(n) for n in names):
        raise ExportError(f"export: the checkpoint holds {len(names)} tensors, not LoRA adapters only; "
                          f"export it as a full model (model.lora.rank unset in its config)")
    with staged_directory(out_dir) as tmp:
        tensors = [(peft_name(n), read(n).to("cpu", dtype).contiguous()) for n in names]
        write_file(f"{tmp}/{ADAPTER_WEIGHTS}", tensors, SAFETENSORS_METADATA)
        write_json(tmp, ADAPTER_CONFIG, adapter_config(cfg.model.lora, cfg.model.pretrained))
        copy_tokenizer(tokenizer_dir, cfg.model.pretrained, tmp)


def merged_reader(cfg: Config, adapter_names: Sequence[str], read_adapter: Read,
                  shapes: dict[str, tuple[int, ...]]) -> Read:
    """read(name) for every parameter of the merged model: the base weight with its adapter folded
    in where it has one. `shapes`: the model's parameters (expected_shapes)."""
    lora = cfg.model.lora
    assert lora.rank is not None
    scaling = lora.alpha / lora.rank
    pairs = adapted_weights(list(adapter_names))
    base = _base_reader(cfg)
    unknown = sorted(set(pairs) - set(shapes))
    if unknown:
        raise ExportError(f"export: the adapters adapt {unknown[0]}, which the base model does not have")

    def read(name: str) -> torch.Tensor:
        weight = base(name, shapes[name])
        if name not in pairs:
            return weight
        a, b = pairs[name]
        return merged_weight(weight, read_adapter(a), read_adapter(b), scaling)

    return read


def _base_reader(cfg: Config) -> Callable[[str, tuple[int, ...]], torch.Tensor]:
    """A base weight whole, rounded as the run held it (parallel/fsdp.py): from the pretrained
    files, or the seeded random initialisation."""
    if not cfg.model.pretrained:
        return lambda name, shape: init_value(name, shape, cfg.model, cfg.train.seed).to(BASE_DTYPE)
    try:
        weights = HFWeights(cfg.model.pretrained)
    except PretrainedError as e:
        raise ExportError(f"export: the base model is needed to merge the adapters: {e}") from None

    def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        out = torch.empty(shape, dtype=BASE_DTYPE)
        weights.read_rows(name, 0, shape[0], out)
        return out

    return read
