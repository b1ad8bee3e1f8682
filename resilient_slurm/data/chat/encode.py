"""A conversation → its token ids, which tokens carry loss, and where its last reply starts.

Finding the assistant turns. The conversation is rendered once and tokenized once, and the
assistant turns are located as character spans of that text, then mapped to tokens:
- If the template has `{% generation %}` markers, the spans are their blocks (what transformers'
  `return_assistant_tokens_mask` uses).
- Otherwise, incrementally: the span of assistant message i starts where
  `render(messages[:i], add_generation_prompt=True)` ends (after the assistant header the model is
  prompted with) and ends where `render(messages[:i+1])` ends (after its end-of-turn token). Each
  of those renderings must be a prefix of the next and of the full text; a template that renders
  an earlier turn differently once later turns follow is refused with a reason, never guessed at.
Tokenizing pieces separately would differ from the whole where a merge crosses a boundary, which
is why spans are mapped instead: token i covers the characters from the end of token i-1 to its own
end (robust to tokenizers that trim whitespace out of their offsets), and it is in a span when
that range overlaps the span, like transformers' assistant mask.

Loss modes: `assistant` (every assistant turn, the default), `last` (only the last assistant turn)
and `all` (every token). The exact-match sample of a conversation is its prompt up to the last
assistant turn (the same tokens as `render(..., add_generation_prompt=True)` in the usual case)
and that turn's tokens through its first end-of-turn id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from resilient_slurm.data.chat.format import Message
from resilient_slurm.data.chat_template import ChatTemplate, TemplateRenderError


@dataclass(frozen=True)
class RenderedChat:
    text: str
    spans: list[tuple[int, int]]
    """Character spans of the assistant turns, in order."""


@dataclass(frozen=True)
class EncodedChat:
    ids: np.ndarray
    """int32 token ids of the whole conversation."""
    loss: np.ndarray
    """bool per token: the token is a training target."""
    prompt_len: int
    """Tokens before the last assistant turn: the exact-match prompt."""
    target_len: int
    """Tokens of the last assistant turn through its first end-of-turn id: the exact-match target."""


def render_chat(template: ChatTemplate, messages: list[Message],
                tools: list[dict[str, Any]] | None = None) -> RenderedChat:
    text, spans = template.render(messages, tools=tools)
    if template.has_generation_markers:
        if not spans:
            raise TemplateRenderError("the template's {% generation %} blocks marked no assistant text")
        return RenderedChat(text, spans)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True, tools=tools)[0]
        through = text if i == len(messages) - 1 else template.render(messages[: i + 1], tools=tools)[0]
        if not (through.startswith(before) and text.startswith(through)):
            raise TemplateRenderError(
                f"the chat template renders message {i} differently once later turns follow, so assistant "
                "turns cannot be located; use a template with {% generation %} markers")
        spans.append((len(before), len(through)))
    return RenderedChat(text, spans)


def encode_chat(rendered: RenderedChat, ids: list[int], offsets: list[tuple[int, int]], loss_mode: str,
                eos_ids: tuple[int, ...]) -> EncodedChat:
    """Masks of one rendered conversation from its encoding (ids and character offsets)."""
    ends = np.maximum.accumulate(np.array([end for _, end in offsets], dtype=np.int64))
    starts = np.concatenate((np.zeros(1, dtype=np.int64), ends[:-1]))
    turns = [(starts < b) & (ends > a) for a, b in rendered.spans]
    last = np.flatnonzero(turns[-1])
    if last.size == 0:
        raise TemplateRenderError("the last assistant turn renders to no tokens")
    if loss_mode == "all":
        loss = np.ones(len(ids), dtype=bool)
    elif loss_mode == "last":
        loss = turns[-1]
    else:
        loss = np.logical_or.reduce(turns)
    prompt_len, reply_end = int(last[0]), int(last[-1]) + 1
    reply = ids[prompt_len:reply_end]
    target_len = next((i + 1 for i, t in enumerate(reply) if t in eos_ids), len(reply))
    return EncodedChat(np.asarray(ids, dtype=np.int32), loss, prompt_len, target_len)
