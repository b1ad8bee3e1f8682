"""Command-line overrides checked against the schema and conf/'s groups before Hydra composes them,
so that each mistake gets one line naming it and the fix. Pure.

Hydra's own messages are several lines and sometimes wrong advice (`optim.lrr=1e-3` is told to
write `+optim.lrr=1e-3`, which adds the typo); the checks here find what it would refuse first:
keys the schema does not have (with the likeliest one meant), a group option that does not exist
(with the options), a group given with a `+` it needs or must not have, an override without `=`.
What still reaches Hydra and fails is translated by `hydra_problem`. Keys under a section a
user's own function brings (`entry=`, `+own=...`) are theirs and are not checked, but for `+NAME=WORD`
with no group NAME/ to choose WORD from, which Hydra would silently make the string "WORD".
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from resilient_slurm.config.checks import not_a_key

_HYDRA = ("hydra.", "hydra/")
# Keys whose value is a list of records, written `[{k:v,...},...]`: braces a shell expands unquoted.
_RECORD_LISTS = ("data.sources",)


@dataclass(frozen=True)
class Schema:
    """The keys a config has: its values (`optim.lr`), its sections (`optim`, `model.lora`), and
    its dict-valued keys, below which any key is the user's (`cluster.sbatch_extra.x`)."""

    keys: frozenset[str]
    sections: frozenset[str]
    open: frozenset[str]

    @classmethod
    def of(cls, cfg: object) -> Schema:
        """From a config instance (`Config()`): its dataclass fields, walked."""
        keys: set[str] = set()
        sections: set[str] = set()
        opened: set[str] = set()

        def walk(obj: object, prefix: str) -> None:
            for f in fields(obj):  # type: ignore[arg-type]
                value, key = getattr(obj, f.name), prefix + f.name
                if is_dataclass(value):
                    sections.add(key)
                    walk(value, key + ".")
                    continue
                keys.add(key)
                if "dict" in str(f.type):
                    opened.add(key)

        walk(cfg, "")
        return cls(frozenset(keys), frozenset(sections), frozenset(opened))

    @property
    def tops(self) -> frozenset[str]:
        return frozenset(k.split(".")[0] for k in self.keys | self.sections)

    def knows(self, key: str) -> bool:
        return key in self.keys or key in self.sections or any(key.startswith(o + ".") for o in self.open)


@dataclass(frozen=True)
class Groups:
    """conf/'s config groups: each one's options, and those the defaults list already chooses."""

    options: Mapping[str, tuple[str, ...]]
    chosen: frozenset[str]
    """Groups conf/config.yaml chooses (overridden without `+`); the others (experiment) need one."""


@dataclass(frozen=True)
class Override:
    text: str
    prefix: str
    """'', '+', '++' or '~'."""
    key: str
    value: str | None
    """None: no `=` at all."""


def parse(text: str) -> Override:
    prefix = "~" if text.startswith("~") else "++" if text.startswith("++") else "+" if text.startswith("+") else ""
    key, sep, value = text[len(prefix):].partition("=")
    return Override(text, prefix, key.split("@")[0], value if sep else None)


def check(overrides: Sequence[str], schema: Schema, groups: Groups, entry: bool) -> list[str]:
    """One line per override Hydra would refuse or misread. `entry`: a user's own function runs,
    so unknown top-level keys are its own config."""
    problems: list[str] = []
    seen: set[str] = set()
    for o in map(parse, overrides):
        if o.key.startswith(_HYDRA) or o.key == "hydra":
            continue
        if o.key.startswith(("+", "~")):
            problems.append(f"{o.text}: too many + or ~; write KEY=VALUE to set a key, +KEY=VALUE to add one of your "
                            f"own, ~KEY to remove one")
            continue
        if o.key in groups.options:
            problems += _group_problem(o, groups, seen)
            continue
        if o.key in _RECORD_LISTS and o.value and ":" in o.value and "{" not in o.value:
            if o.key not in seen:  # the shell made several arguments of it: one line for them all
                seen.add(o.key)
                problems.append(f"{o.text}: the shell took this value's braces apart (brace expansion); quote the "
                                f"whole override: '{o.key}=[{{name:web,path:/data/tok/web,weight:0.7}},...]'")
            continue
        if o.value is None and o.prefix != "~":
            problems.append(f"{o.key}: no value; write {o.key}=VALUE")
            continue
        top = o.key.split(".")[0]
        if top not in schema.tops:
            if entry and o.prefix == "+" and o.key == top and _a_name(o.value):
                # Hydra makes `+own=default` the string "default" when no group own/ is on the search path.
                problems.append(f"{o.text}: no config group {o.key}/ on the search path, so {o.key} would be the "
                                f"string {o.value!r}; pass --config-dir DIR with {o.key}/{o.value}.yaml in it, or quote "
                                f"the value (+{o.key}='{o.value}') if you mean the string")
                continue
            # A section of the user's own (a group of theirs), or `+key=...` with an entry in a preset:
            # the composed config tells (config.compose refuses what is left over).
            if top in groups.options or o.prefix in ("+", "++"):
                continue
            problems.append(f"{o.key}: not a config key; write +{o.text} to add a key of your own" if entry
                            else not_a_key(o.key, schema.keys))
        elif not schema.knows(o.key):
            problems.append(not_a_key(o.key, schema.keys))
        elif o.key == "data.val_samples" and (line := _val_samples_problem(o.value)):
            problems.append(line)
        elif o.prefix == "+" and o.key in schema.keys:
            problems.append(f"{o.text}: {o.key} is a key of the config already; drop the + (write {o.text[1:]})")
        elif o.key in schema.sections and o.value is not None and not o.value.startswith("{"):
            problems.append(f"{o.key}: a section, not a value; set one of its keys ({o.key}.KEY=VALUE)")
        elif o.prefix == "" and o.key not in schema.keys | schema.sections:
            parent = next(p for p in schema.open if o.key.startswith(p + "."))
            problems.append(f"{o.key}: a new entry of {parent}; write +{o.text}")
    return problems


def _a_name(value: str | None) -> bool:
    """An unquoted word that is not a number or a YAML constant: what a config group's option looks like."""
    return bool(value and re.fullmatch(r"[A-Za-z_][\w-]*", value)
                and value.lower() not in ("true", "false", "null", "none", "nan", "inf"))


def _val_samples_problem(value: str | None) -> str | None:
    """`data.val_samples` is a count when written as a whole number (`256`) and a share when below 1
    (`0.05`); `2.0` could mean either, so it is refused rather than guessed."""
    try:
        number = float(value or "")
    except ValueError:
        return None  # not a number: the type check says so
    if number < 1 or not any(c in (value or "") for c in ".eE") or not number.is_integer():
        return None
    return (f"data.val_samples: {value} is ambiguous; write {int(number)} to hold out {int(number)} conversations, "
            f"or a share below 1 (0.05 for 5%)")


def _group_problem(o: Override, groups: Groups, seen: set[str]) -> list[str]:
    options = groups.options[o.key]
    choose = f"choose one of {', '.join(options)}"
    if o.prefix == "~":
        return []
    if o.prefix == "++":
        fixed = o.text[1:] if o.key not in groups.chosen else o.text[2:]
        return [f"{o.text}: a config group takes one + at most; write {fixed}"]
    if o.prefix == "+" and o.key in seen:  # a plain override again just replaces the choice
        return [f"{o.text}: {o.key} is chosen twice; keep one"]
    if o.prefix == "+":
        seen.add(o.key)
    what = "experiment" if o.key == "experiment" else "option"
    if not o.value:
        return [f"{o.key}: empty; {choose}"]
    if o.value not in options and "," not in o.value:
        close = difflib.get_close_matches(o.value, options, n=1)
        meant = f" (did you mean {close[0]}?)" if close else ""
        return [f"{o.key}: no {what} {o.value!r}{meant}; {choose}"]
    if o.key not in groups.chosen and not o.prefix:
        return [f"{o.text}: {o.key} has no default to override, so it takes a +; write +{o.text}"]
    if o.key in groups.chosen and o.prefix == "+":
        return [f"{o.text}: {o.key} already has a default choice; write {o.text[1:]}"]
    return []


def unknown_keys(tree: Mapping[str, Any], schema: Schema) -> list[str]:
    """Keys of a composed (nested) config the schema does not have, as flattened names."""
    out: list[str] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for k, v in node.items():
            key = prefix + str(k)
            if not schema.knows(key):
                out.append(key)
            elif key in schema.sections and isinstance(v, Mapping):
                walk(v, key + ".")

    walk(tree, "")
    return out


def unknown_override(message: str) -> str | None:
    """The key of Hydra's "Could not override 'own.lrr'" (a key its section does not have)."""
    m = re.search(r"Could not override '([\w.]+)'", message)
    return m.group(1) if m else None


def hydra_problem(message: str, schema: Schema, groups: Groups) -> str:
    """Hydra's error text as one line naming the argument and the fix."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0] if lines else "Hydra could not compose the config"
    if m := re.match(r"Error parsing override '(.*)'", first):
        detail = (lines[1] if len(lines) > 1 else "malformed").split(" expecting ")[0]  # not the grammar's tokens
        return f"{m.group(1)}: not KEY=VALUE in Hydra's override grammar ({detail}); fix it, or quote the value"
    if m := re.search(r"Could not (?:find|load) '([^/']+)/([^']*)'", first):
        group, option = m.group(1), m.group(2)
        if group in groups.options and option not in groups.options[group]:
            return _group_problem(Override(f"+{group}={option}", "+", group, option), groups, set())[0]
    if m := re.search(r"An item is already at '([\w.]+)'", first):
        return f"+{m.group(1)}: {m.group(1)} is a key of the config already; drop the + (write {m.group(1)}=VALUE)"
    if m := re.search(r"Could not (?:override|delete from config)\.? '?([\w.]+)'?", first):
        key = m.group(1)
        if schema.knows(key) and key not in schema.keys | schema.sections:
            return f"{key}: a new entry; write +{key}=VALUE"
        return not_a_key(key, schema.keys)
    if m := re.match(r"Multiple values for (\w+)", first):
        return f"{m.group(1)}: chosen twice; keep one"
    return f"{first}; check the key=value arguments"
