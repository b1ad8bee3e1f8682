"""One line of a chat `.jsonl` file → the conversation's messages, or the reason it is malformed.

Two formats, told apart per line:
- `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}`, OpenAI
  style, any number of turns;
- `{"prompt": ..., "completion": ...}`: strings (a user turn and the assistant's answer) or lists of
  messages (TRL's conversational prompt/completion).
What reaches the template: each message's `role` and `content`, and for tool use (the shape
OpenAI's API and transformers' `apply_chat_template` share) an assistant's `tool_calls` (its
content may then be empty or null), a tool message's `name` and `tool_call_id`, and the line's
`tools` (function schemas), which the template renders where it puts them (Qwen: a `<tools>` block
in the system turn). Other keys are ignored. A conversation needs at least one assistant message:
the loss and the exact-match target come from them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
TOOL_KEYS = ("tool_calls", "name", "tool_call_id")
"""Message keys beside role and content that reach the template: an assistant's tool_calls, a tool
message's name and tool_call_id (elsewhere they are ignored, as they always were)."""
_KEPT = {"assistant": ("tool_calls",), "tool": ("name", "tool_call_id")}
Message = dict[str, Any]


@dataclass(frozen=True)
class Conversation:
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    """Function schemas the template may render (`tools` of apply_chat_template)."""


class BadLine(ValueError):
    """A line is not a conversation; the message says what is wrong (the caller adds file:line)."""


def parse_conversation(line: str) -> list[Message]:
    return parse_line(line).messages


def parse_line(line: str) -> Conversation:
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
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadLine("'tools' must be a list of function schemas (objects)")
    return Conversation(messages, tools or None)


def conversation_key(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> int:
    """A 64-bit hash of the conversation's content: the held-out split is chosen by it, so copies of
    one conversation land on the same side however they are formatted or ordered in the file. Tool
    calls and tools count only where present, so a plain conversation keeps the key it always had."""
    parts: list[Any] = [[m["role"], m["content"], *[[k, m[k]] for k in TOOL_KEYS if k in m]] for m in messages]
    if tools:
        parts.append(["tools", tools])
    canonical = json.dumps(parts, ensure_ascii=False, sort_keys=True)
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
        calls = m.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list)
                                  or not all(isinstance(c, dict) for c in calls)):
            raise BadLine(f"{where}.tool_calls must be a list of calls (objects) on an assistant message")
        if content is None and calls:
            content = ""  # an assistant turn that only calls tools
        if not isinstance(content, str):
            raise BadLine(f"{where}.content must be a string, not {type(content).__name__}")
        message: Message = {"role": role, "content": content}
        message.update({k: m[k] for k in _KEPT.get(role, ()) if m.get(k) is not None})
        out.append(message)
    return out
