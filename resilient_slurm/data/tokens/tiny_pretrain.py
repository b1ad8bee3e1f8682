"""`asset:tiny_pretrain/prose` and `asset:tiny_pretrain/math`: the tiny corpus, tokenized on first
use into the data cache, so `tiny_pretrain` runs on a fresh machine through the same tokenize →
prepare → train path as a real corpus, with nothing to download.

The entry `<cache>/tiny_pretrain-<key>/` is keyed by the generator's settings and the tokenizer;
it holds the generated `.jsonl` files and their `.bin/.idx` prefixes. Ranks that start together
(the first start of the recipe) take turns under a lock: the first writes the entry, the others
find it finished.
"""

from __future__ import annotations

import hashlib
import json
import os

from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.tiny_corpus import KINDS, documents
from resilient_slurm.data.tokens.tokenize_files import tokenize
from resilient_slurm.data.tokenizer import ChatTokenizer, resolve_path
from resilient_slurm.files import locked

ASSET = "asset:tiny_pretrain/"
TOKENIZER = "asset:tiny_chat"
"""The tokenizer the package ships (a 485-token byte-level BPE; conf/model/llama_tiny embeds 512)."""
DOCUMENTS = {"prose": 6000, "math": 3000}
GENERATOR_VERSION = 1
BUILD_TIMEOUT_S = 900.0
"""How long a rank waits for another to tokenize the corpus (seconds on an idle laptop)."""


def tiny_pretrain_prefixes(cache_dir: str) -> dict[str, str]:
    """Generate and tokenize the corpus under `cache_dir` (once); each kind's Megatron prefix."""
    digest = ChatTokenizer(resolve_path(TOKENIZER), need_template=False).digest
    key = hashlib.sha256(json.dumps([GENERATOR_VERSION, DOCUMENTS, digest]).encode()).hexdigest()[:16]
    root = os.path.join(cache_dir, f"tiny_pretrain-{key}")
    os.makedirs(root, exist_ok=True)
    with locked(os.path.join(root, ".lock"), timeout_s=BUILD_TIMEOUT_S):
        return _build(root)


def _build(root: str) -> dict[str, str]:
    out = {}
    for kind in KINDS:
        prefix = os.path.join(root, kind)
        out[kind] = prefix
        if os.path.exists(prefix + ".tokenize.json"):
            continue
        text = os.path.join(root, f"{kind}.jsonl")
        if not os.path.exists(text):
            tmp = f"{text}.tmp-{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                for doc in documents(kind, DOCUMENTS[kind]):
                    f.write(json.dumps({"text": doc}) + "\n")
            os.replace(tmp, text)
        tokenize([text], prefix, TOKENIZER, progress=False)
    return out


def resolve_source_path(path: str, cache_dir: str) -> str:
    """A source path as given, or the prefix `asset:tiny_pretrain/KIND` stands for."""
    if not path.startswith(ASSET):
        return path
    kind = path[len(ASSET):]
    if kind not in KINDS:
        raise TokenDataError(f"{path}: no such tiny corpus; use {', '.join(ASSET + k for k in KINDS)}")
    return tiny_pretrain_prefixes(cache_dir)[kind]
