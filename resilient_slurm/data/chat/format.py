"""One line of a chat `.jsonl` file → the conversation's messages, or the reason it is malformed.

Two formats, told apart per line:
- `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}`, OpenAI
  style, any number of turns;
- `{"prompt": ..., "completion": ...}`: strings (a user turn and the assistant's answer) or lists of
  messages (TRL's conversational prompt/completion).
Only `role` and `content` reach the template; other keys of a message are ignored. A conversation
needs at least one assistant message: the loss and the exact-match target come from them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, str]


class BadLine(ValueError):
    """A line is not a conversation; the message says what is wrong (the caller adds file:line)."""


def parse_conversation(line: str) -> list[Message]:
    try:
        record = json.loads(line)
    except ValueError as e:
        raise BadLine(f"not valid JSON ({e})") from None
    if not isinstance(record, dict):
        raise BadLine(f"a JSON {type(record).__name__}, not an object with 'messages' or 'prompt'/'completion'")
    if "messages" in record:
        messages = _messages(record["messages"], "messages")
    elif "prompt" in record or "completion" in record:
        if "prompt" not in record or "completion" not in record:
            present, missing = ("prompt", "completion") if "prompt" in record else ("completion", "prompt")
            raise BadLine(f"has '{present}' but no '{missing}'")
        messages = _side(record["prompt"], "prompt", "user") + _side(record["completion"], "completion", "assistant")
    else:
        keys = ", ".join(sorted(record)[:5]) or "none"
        raise BadLine(f"no 'messages' and no 'prompt'/'completion' (keys: {keys})")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadLine("no assistant message to train on")
    return messages


def conversation_key(messages: list[Message]) -> int:
    """A 64-bit hash of the conversation's content: the held-out split is chosen by it, so copies of
    one conversation land on the same side however they are formatted or ordered in the file."""
    canonical = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "big")


def _side(value: Any, key: str, role: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return _messages(value, key)


def _messages(value: Any, key: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise BadLine(f"'{key}' must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise BadLine(f"{where} is a {type(m).__name__}, not an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadLine(f"{where}.role is {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadLine(f"{where}.content must be a string, not {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out
