"""What a PEFT LoRA adapter directory holds, as data: file names, tensor names and
adapter_config.json. Pure.

    adapter_config.json         peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
                                target_modules, base_model_name_or_path, ...
    adapter_model.safetensors   base_model.model.<our name>, e.g.
                                base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight

`peft.PeftModel.from_pretrained(base, DIR)` and vLLM's `--lora-modules NAME=DIR` read this.
"""

from __future__ import annotations

from typing import Any

from resilient_slurm.config import LoRAConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""PEFT's wrappers around the model (a PeftModel's `base_model`, the LoraModel's `model`); its saved
keys drop the adapter's name (`.lora_A.default.weight` is saved as `.lora_A.weight`), which is how
our parameters are named already."""
A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


def peft_name(name: str) -> str:
    """The key of our adapter parameter `name` in adapter_model.safetensors."""
    return PEFT_PREFIX + name


def adapter_config(lora: LoRAConfig, base_model: str | None) -> dict[str, Any]:
    """adapter_config.json for adapters trained with `lora` on the model in directory `base_model`
    (None: a base of random weights, which has no directory)."""
    assert lora.rank is not None
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "revision": None,
        "inference_mode": True,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": list(lora.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def adapted_weights(names: list[str]) -> dict[str, tuple[str, str]]:
    """Base weight name -> (its lora_A, its lora_B), for the adapter parameters in `names`."""
    present = set(names)
    out: dict[str, tuple[str, str]] = {}
    for name in names:
        if name.endswith(A_SUFFIX):
            module = name[: -len(A_SUFFIX)]
            if module + B_SUFFIX not in present:
                raise ValueError(f"adapter {module} has lora_A but no lora_B")
            out[module + ".weight"] = (name, module + B_SUFFIX)
    return out
