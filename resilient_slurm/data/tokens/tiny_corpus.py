"""The small pretraining corpus of `tiny_pretrain`, generated (nothing ships but this code), and
learnable by a ~3M-parameter model in about a minute on a CPU.  [pure]

Two sources, so the recipe exercises a mixture and per-source validation:
- prose: short documents of templated sentences over the words the shipped tiny tokenizer knows
  ("the red cat is on the rock. ... where is the red cat? on the rock."), letter runs and
  list tasks (reverse, sort), so the model can learn grammar, copying from earlier in the document
  and simple order;
- math: lines of one-digit sums and differences ("3 + 4 = 7.").
Documents are a pure function of (kind, count, seed); the first `count` are always the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

KINDS = ("prose", "math")
COLORS = ["red", "blue", "green"]
THINGS = ["cat", "dog", "sun", "tree", "fish", "bird", "moon", "star", "rock"]
LETTERS = list("abcdefghij")


def documents(kind: str, count: int, seed: int = 0) -> Iterator[str]:
    rng = random.Random(f"{kind}:{seed}")
    make = _prose if kind == "prose" else _math
    for _ in range(count):
        yield make(rng)


def _prose(rng: random.Random) -> str:
    sentences: list[str] = []
    facts: list[tuple[str, str, str]] = []
    for _ in range(rng.randint(3, 7)):
        pick = rng.random()
        if pick < 0.4:
            fact = (rng.choice(COLORS), rng.choice(THINGS), rng.choice(THINGS))
            facts.append(fact)
            sentences.append(f"the {fact[0]} {fact[1]} is on the {fact[2]}.")
        elif pick < 0.6 and facts:
            color, thing, place = rng.choice(facts)
            sentences.append(f"where is the {color} {thing}? on the {place}.")
        elif pick < 0.75:
            first = rng.randrange(len(LETTERS) - 4)
            sentences.append(" ".join(LETTERS[first:first + rng.randint(3, 5)]) + ".")
        else:
            items = rng.sample(THINGS, 3)
            if rng.random() < 0.5:
                sentences.append(f"reverse {' '.join(items)}: {' '.join(reversed(items))}.")
            else:
                sentences.append(f"sort {' '.join(items)}: {' '.join(sorted(items))}.")
    return " ".join(sentences)


def _math(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(4, 8)):
        a, b = rng.randrange(10), rng.randrange(10)
        if rng.random() < 0.5:
            lines.append(f"{a} + {b} = {a + b}.")
        else:
            a, b = max(a, b), min(a, b)
            lines.append(f"{a} - {b} = {a - b}.")
    return " ".join(lines)
