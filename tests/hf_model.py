"""A small pretrained Hugging Face Llama directory for tests, written by the real `transformers`
(save_pretrained, sharded safetensors with an index) with the tokenizer and chat template the package
ships: what a user's model directory looks like, a few hundred kilobytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.data.tokenizer import TOKENIZER_FILES

SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0)


def make_hf_model(directory: Path, seed: int = 0, shard: str = "100KB", **overrides) -> Path:
    """Write the model to `directory` (float32 weights, in several shards) and return it."""
    import transformers

    tokenizer_dir = Path(resolve_path("asset:tiny_chat"))
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**SIZES, **overrides}, bos_token_id=None, eos_token_id=None)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at ones: make every weight distinct
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(directory, max_shard_size=shard)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory
