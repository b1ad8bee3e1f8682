"""A Hugging Face model directory's tokenizer and chat template, without transformers at run time.

Decision: the `tokenizers` library (the Rust tokenizer behind every "fast" HF tokenizer) reads
`tokenizer.json`, and jinja2 renders the chat template (`chat_template.py`). That is all
`apply_chat_template` does for a fast tokenizer, it keeps transformers (large, slow to import, and
changing its tokenizer API between major versions) out of every rank's start-up, and torchtitan and
torchtune made the same choice. transformers stays the oracle in the tests.

What comes from which file, the way transformers reads it:
- `tokenizer.json`: vocabulary, merges, added and special tokens.
- the chat template: `chat_template.jinja` when present (it takes priority), else
  `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates: "default").
- special tokens (`bos_token`, `eos_token`, `pad_token`, ...): each from `tokenizer_config.json`, else
  from the older `special_tokens_map.json`; a string or an `{"content": ...}` object.
- the ids that end a turn (`eos_ids`): the eos token, then `generation_config.json`'s and
  `config.json`'s `eos_token_id` (an int or a list; Llama-3.1-Instruct lists three).

Rendered text is encoded without adding special tokens (the template writes BOS itself), exactly
as `apply_chat_template(tokenize=True)` does.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from tokenizers import Encoding, Tokenizer

from resilient_slurm.data.chat_template import ChatTemplate
from resilient_slurm.errors import InputError

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")
"""The files a fine-tuned model's directory needs from its base to tokenize the same way."""


ASSET_PREFIX = "asset:"
ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat", "assets")


def resolve_path(path: str) -> str:
    """`asset:NAME[/FILE]` is a file the package ships (resilient_slurm/data/chat/assets/); any other
    path is returned as it is. Here, beside the tokenizer, so that resolving one needs no torch."""
    if not path.startswith(ASSET_PREFIX):
        return path
    return os.path.join(ASSETS_DIR, *path[len(ASSET_PREFIX):].split("/"))


class TokenizerError(InputError):
    """The tokenizer directory is unusable; the message is one line naming it and the fix."""


class ChatTokenizer:
    """Encode, decode and render chats with one model directory's tokenizer and template."""

    def __init__(self, directory: str, need_template: bool = True) -> None:
        """`need_template=False`: a base model's directory without a chat template is fine (pretraining
        tokenizes plain text); rendering a chat then raises TokenizerError."""
        self.directory = directory
        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(f"tokenizer: {directory} has no tokenizer.json; point data.tokenizer (or "
                                 "model.pretrained) at a Hugging Face model directory that has one")
        self.tokenizer = Tokenizer.from_file(path)
        config = _read_json(os.path.join(directory, "tokenizer_config.json"))
        legacy = _read_json(os.path.join(directory, "special_tokens_map.json"))
        specials = {k: config.get(k) if config.get(k) is not None else legacy.get(k) for k in SPECIAL_TOKEN_KEYS}
        self.special_tokens = {k: _token_text(v) for k, v in specials.items() if v is not None}
        source, origin = _template_source(directory, config, need_template)
        self._template = ChatTemplate(source, origin, self.special_tokens) if source else None
        self.eos_ids = self._eos_ids(directory)
        pad = self.special_tokens.get("pad_token")
        pad_id = self.tokenizer.token_to_id(pad) if pad else None
        self.pad_id: int = pad_id if pad_id is not None else self.eos_ids[0]
        """Fills the unused end of a packed row (never trained on, never attended across)."""
        with open(path, "rb") as f:
            tokenizer_bytes = f.read()
        self.digest = hashlib.sha256(tokenizer_bytes + json.dumps(
            [source, self.special_tokens, self.eos_ids], sort_keys=True).encode()).hexdigest()
        """Changes whenever the token ids of any chat would change: a cache key."""

    @property
    def vocab_size(self) -> int:
        """Token ids are below this (the model's embedding needs at least this many rows)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> Encoding:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[Encoding]:
        """Several texts at once (the Rust side uses its own threads)."""
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            _template_source(self.directory, {}, True)  # raises the error that names the fix
        assert self._template is not None
        return self._template

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        return self.template.render(messages, add_generation_prompt, tools)[0]

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The token ids transformers' `apply_chat_template(messages, tools=tools, tokenize=True)` gives."""
        return list(self.encode(self.render(messages, add_generation_prompt, tools)).ids)

    def _eos_ids(self, directory: str) -> tuple[int, ...]:
        ids: list[int] = []
        eos = self.special_tokens.get("eos_token")
        eos_id = self.tokenizer.token_to_id(eos) if eos is not None else None
        if eos_id is not None:
            ids.append(int(eos_id))
        for name in ("generation_config.json", "config.json"):
            value = _read_json(os.path.join(directory, name)).get("eos_token_id")
            for i in value if isinstance(value, list) else [] if value is None else [value]:
                if int(i) not in ids:
                    ids.append(int(i))
        if not ids:
            raise TokenizerError(f"tokenizer: {directory} names no end-of-sequence token; set eos_token in "
                                 "tokenizer_config.json or eos_token_id in generation_config.json")
        return tuple(ids)


def _template_source(directory: str, config: dict[str, Any], needed: bool) -> tuple[str, str]:
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), jinja_path
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if (not isinstance(template, str) or not template) and not needed:
        return "", ""
    if not isinstance(template, str) or not template:
        raise TokenizerError(f"chat template: {directory} has none (no chat_template.jinja, no chat_template in "
                             "tokenizer_config.json); add one, e.g. from the instruct model's tokenizer_config.json")
    return template, os.path.join(directory, "tokenizer_config.json")


def _token_text(value: Any) -> str:
    return str(value["content"]) if isinstance(value, dict) else str(value)


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"tokenizer: {path} is not readable JSON ({e}); restore the file") from None
    return data if isinstance(data, dict) else {}
