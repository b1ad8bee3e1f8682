"""What every section's validation shares: the error type, the problem collector, names, flattening. [pure]"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from typing import Any

from resilient_slurm.errors import InputError


class ConfigError(InputError):
    """A config value is wrong; the message is one line naming the key and the fix."""


class Problems(list[str]):
    """Problem lines, `key: what is wrong; fix`, at most one per key: the first found with it."""

    def need(self, ok: bool, msg: str) -> None:
        if not ok and key_of(msg) not in {key_of(line) for line in self}:
            self.append(msg)

    def extend_new(self, lines: list[str]) -> None:
        for line in lines:
            self.need(False, line)


def key_of(line: str) -> str:
    return line.split(":")[0]


def suggest(key: str, known: Iterable[str]) -> str | None:
    """The known key a misspelt `key` most likely meant: the closest whole key (`optim.lrr` ->
    `optim.lr`), else the key whose last part is closest (`lr` -> `optim.lr`); None if none is close."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return close[0]
    by_leaf: dict[str, str] = {}
    for k in known:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], k)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None


def not_a_key(key: str, known: Iterable[str]) -> str:
    """The one line for a key the schema does not have, with the likeliest one it meant."""
    close = suggest(key, known)
    hint = f"did you mean {close}?" if close else "python -m resilient_slurm.launch --help lists the keys"
    return f"{key}: not a config key; {hint}"


def safe_name(name: str) -> bool:
    """Letters, digits, '.', '_' and '-' only: a name that is one path component."""
    return bool(name) and name not in (".", "..") and all(ch.isalnum() or ch in "._-" for ch in name)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """`{"optim.lr": 1e-4, ...}` from a typed config or nested dict (for diffs and names)."""
    if is_dataclass(obj):
        obj = {f.name: getattr(obj, f.name) for f in fields(obj)}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: obj}
