"""Chat templates rendered the way Hugging Face renders them, without importing transformers.

A model's chat template is untrusted code from its repository, so it runs in jinja2's immutable
sandbox. The environment matches the one transformers' `apply_chat_template` gives a template
(trim_blocks, lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII and does not escape
HTML, `raise_exception`, `strftime_now`, and the special tokens as variables), so the text comes out
the same byte for byte; the tests compare the two.

`{% generation %} ... {% endgeneration %}` marks the text the assistant generates (the markers
transformers' `return_assistant_tokens_mask` reads). Rendering returns the character spans of those
blocks: the block's text is wrapped in two private-use characters that are cut out afterwards, which
is simpler than tracking the output length while jinja streams it. With such a template, a
conversation that itself contains those characters is refused rather than mis-measured.

Caveat: a template that calls `strftime_now` renders today's date, so its text (and a cache built
from it) changes from day to day; Llama-3.1's template takes a fixed date unless one is passed.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from resilient_slurm.errors import InputError

_OPEN, _CLOSE = "\ue000", "\ue001"
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateRenderError(InputError):
    """The template refused a conversation (`raise_exception`) or failed on it."""


class _Generation(Extension):
    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller: Any) -> str:
        return f"{_OPEN}{caller()}{_CLOSE}"


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template plus the variables it sees besides the conversation."""

    def __init__(self, source: str, origin: str, variables: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_Generation, loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TemplateRenderError(f"chat template of {origin}: syntax error on its line {e.lineno}: {e.message}; "
                             "fix the template") from None
        self.source = source
        self.variables = dict(variables)
        self.has_generation_markers = bool(_GENERATION.search(source))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The text, and the character spans of its `{% generation %}` blocks (empty without markers).
        `tools`: function schemas, as transformers passes them (a template with tool-call branches
        renders them; others ignore them)."""
        if self.has_generation_markers and any(_OPEN in m["content"] or _CLOSE in m["content"] for m in messages):
            raise TemplateRenderError("a message contains the private-use characters U+E000/U+E001; remove them")
        try:
            raw = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        tools=tools, documents=None, **self.variables)
        except jinja2.exceptions.TemplateError as e:
            raise TemplateRenderError(f"the chat template refused it: {e}") from None
        if not self.has_generation_markers:
            return raw, []
        return _cut_markers(raw)


def _cut_markers(raw: str) -> tuple[str, list[tuple[int, int]]]:
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    length, start = 0, -1
    for piece in re.split(f"([{_OPEN}{_CLOSE}])", raw):
        if piece == _OPEN:
            start = length
        elif piece == _CLOSE:
            spans.append((start, length))
        else:
            parts.append(piece)
            length += len(piece)
    return "".join(parts), spans
