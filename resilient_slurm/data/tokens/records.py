"""One input record → the text to tokenize, or what is wrong with it.  [pure]"""

from __future__ import annotations

import json
from typing import Any


def text_of_line(raw: bytes, key: str) -> tuple[str | None, str | None]:
    """(text, None) for a good .jsonl line, (None, problem) for a bad one, (None, None) for a blank one."""
    if not raw.strip():
        return None, None
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 ({e.reason} at byte {e.start})"
    except ValueError as e:
        return None, f"not valid JSON ({str(e).splitlines()[0]})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object with a {key!r} key"
    return text_of_value(record.get(key, _MISSING), key)


_MISSING = object()


def text_of_value(value: Any, key: str) -> tuple[str | None, str | None]:
    """The text of a record's `key` field (a parquet cell, a JSON value), or what is wrong with it."""
    if value is _MISSING:
        return None, f"no {key!r} key (use --text-key to name the text field)"
    if value is None:
        return None, f"{key!r} is null"
    if not isinstance(value, str):
        return None, f"{key!r} is a {type(value).__name__}, not a string"
    return value, None
