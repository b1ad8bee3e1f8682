"""The small chat task set the package ships (assets/tiny_chat, written by tools/make_tiny_chat).

Short instruction tasks a ~3M-parameter model visibly learns on a CPU in a few hundred steps:
repeat, reverse or sort a few items, add two digits, name the first or last item, count items,
write a word in capitals, answer a greeting. About a quarter of the conversations have a system
prompt, a fifth go on to a second turn ("Now sort them."), and a third of the single-turn ones are
`prompt`/`completion` lines, so every format and loss mode is exercised. Records are a pure
function of `(count, seed)`.

The chat template is Llama-3-style (`<|start_header_id|>role<|end_header_id|>\\n\\n ... <|eot_id|>`,
BOS first, the assistant header as the generation prompt), so the tiny recipe goes through the same
code as a Llama-3 instruct model.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
SPECIAL_TOKENS = [BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT]
CHAT_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}\n"
)

LETTERS = list("abcdefghij")
DIGITS = list("0123456789")
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "tree", "fish", "bird", "moon", "star", "rock"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "You are a careful assistant. Be exact."]
GREETINGS = [("Hello!", "Hello! How can I help?"), ("Hi there.", "Hi! What can I do for you?"),
             ("Good morning.", "Good morning! How can I help?"), ("Thanks!", "You are welcome.")]


def conversations(count: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """`count` records, each one `.jsonl` line's object."""
    rng = random.Random(seed)
    for _ in range(count):
        turns = [_task(rng)]
        if rng.random() < 0.2 and turns[0][2]:
            turns.append(_follow_up(rng, turns[0][2]))
        messages: list[dict[str, str]] = []
        if rng.random() < 0.25:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for user, answer, _ in turns:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        if len(messages) == 2 and rng.random() < 0.33:
            yield {"prompt": messages[0]["content"], "completion": messages[1]["content"]}
        else:
            yield {"messages": messages}


def _task(rng: random.Random) -> tuple[str, str, list[str]]:
    """(user text, answer, the items of the answer a follow-up can work on)."""
    kind = rng.choice(["repeat", "reverse", "sort", "add", "first", "last", "count", "upper", "greet"])
    pool = rng.choice([LETTERS, DIGITS, WORDS])
    items = [rng.choice(pool) for _ in range(rng.randint(2, 5))]
    shown = " ".join(items)
    if kind == "repeat":
        return f"Repeat: {shown}", shown, items
    if kind == "reverse":
        return f"Reverse: {shown}", " ".join(items[::-1]), items[::-1]
    if kind == "sort":
        return f"Sort: {shown}", " ".join(sorted(items)), sorted(items)
    if kind == "add":
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b}?", str(a + b), []
    if kind == "first":
        return f"Which item is first in: {shown}?", items[0], []
    if kind == "last":
        return f"Which item is last in: {shown}?", items[-1], []
    if kind == "count":
        return f"How many items are in: {shown}?", str(len(items)), []
    if kind == "upper":
        word = rng.choice(WORDS)
        return f"Write in capitals: {word}", word.upper(), []
    return (*rng.choice(GREETINGS), [])


def _follow_up(rng: random.Random, items: list[str]) -> tuple[str, str, list[str]]:
    kind = rng.choice(["reverse", "sort", "count"])
    if kind == "reverse":
        return "Now reverse them.", " ".join(items[::-1]), items[::-1]
    if kind == "sort":
        return "Now sort them.", " ".join(sorted(items)), sorted(items)
    return "How many are there?", str(len(items)), []
