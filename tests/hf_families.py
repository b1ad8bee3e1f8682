"""Small pretrained directories of every supported family, written by the real `transformers`
(`save_pretrained`), in both spellings of config.json:

- `v5`: what transformers 5 (installed here) writes: `rope_parameters`, `layer_types`, `dtype`;
- `v4`: the classic spelling of transformers 4 and of every checkpoint on the Hub (top-level
  `rope_theta` and `rope_scaling`, `torch_dtype`, Qwen's `use_sliding_window` with a window set but
  off). transformers 5 only writes its own, so the classic file is made from it by hand, the way
  transformers 4 spelled those keys (Qwen2.5-0.5B-Instruct's and Mistral-7B-v0.1's config.json).

The tokenizer and chat template are the ones the package ships, so a run can train on the tiny set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.data.tokenizer import TOKENIZER_FILES

SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6)
FAMILY_CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}
# What makes each family's tiny model exercise its switches: Qwen3 a head_dim that is not
# hidden/heads, Qwen2 tied embeddings (as its small sizes have).
FAMILY_OVERRIDES = {"llama": {}, "qwen2": {"tie_word_embeddings": True}, "qwen3": {"head_dim": 32},
                    "mistral": {"sliding_window": 4096}}
SPELLINGS = ("v4", "v5")


def make_family_model(directory: Path, family: str, spelling: str = "v5", seed: int = 0, shard: str = "100KB",
                      **overrides) -> Path:
    """Write a tiny `family` model (float32, several shards) with config.json in `spelling`."""
    import transformers

    prefix = FAMILY_CLASSES[family]
    config = getattr(transformers, f"{prefix}Config")(**{**SIZES, **FAMILY_OVERRIDES[family], **overrides},
                                                       bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at ones and biases at zero: make every weight distinct
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(directory, max_shard_size=shard)
    if spelling == "v4":
        classic_config(directory / "config.json", family)
    tokenizer_dir = Path(resolve_path("asset:tiny_chat"))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def classic_config(path: Path, family: str) -> None:
    """Rewrite a transformers 5 config.json in transformers 4's spelling."""
    config = json.loads(path.read_text())
    params = dict(config.pop("rope_parameters", None) or {})
    config["rope_theta"] = params.pop("rope_theta", 10000.0)
    rope_type = params.pop("rope_type", "default")
    config["rope_scaling"] = None if rope_type == "default" else {"rope_type": rope_type, **params}
    config.pop("layer_types", None)
    config["torch_dtype"] = config.pop("dtype", "float32")
    if family in ("qwen2", "qwen3"):
        # A window is set but off, as every Qwen2.5 and Qwen3 config.json on the Hub has it.
        config.update(use_sliding_window=False, sliding_window=32768 if family == "qwen2" else None,
                      max_window_layers=21)
    config["transformers_version"] = "4.46.0"
    path.write_text(json.dumps(config, indent=2) + "\n")


def load_theirs(directory: Path, dtype: torch.dtype = torch.float32):
    """The oracle: transformers reading the directory back."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
