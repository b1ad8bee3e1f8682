"""`python -m resilient_slurm.launch --help [SECTION|KEY]`: the experiments, the groups and the keys,
each key with the doc string written beneath its field in resilient_slurm/config/*.py.

The docs are read from the source with `ast`, not by importing the config package: that would
import OmegaConf (and the help would take a second more), and the help must come at once. Standard
library only, for the same reason.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE.parent / "conf"
WIDTH = 100

# What a new user sets first; `--help SECTION` lists the rest.
MAIN_KEYS = (
    "run.root", "run.name", "run.fork", "model.pretrained", "model.lora.rank", "data.path", "data.seq_len",
    "data.global_batch_size", "data.micro_batch_size", "optim.lr", "optim.warmup_steps", "train.max_steps",
    "train.seed", "train.threads", "checkpoint.every_steps", "checkpoint.every_minutes", "checkpoint.keep_last",
    "cluster.ranks", "cluster.nodes", "cluster.partition", "cluster.time_min", "eval.every_steps", "tracking.mode",
    "entry",
)


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    doc: str


def keys() -> dict[str, Key]:
    """Every key of the schema, from the dataclasses' source: `optim.lr` -> its type, default, doc."""
    classes: dict[str, list[tuple[str, str, ast.expr | None, str]]] = {}
    for path in sorted((PACKAGE / "config").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = _fields(node)
    out: dict[str, Key] = {}

    def walk(cls: str, prefix: str) -> None:
        for name, kind, value, doc in classes.get(cls, []):
            section = _section_of(value)
            if section in classes:
                walk(section, f"{prefix}{name}.")
            else:
                out[prefix + name] = Key(prefix + name, kind, _default(value), doc)

    walk("Config", "")
    return out


def _fields(cls: ast.ClassDef) -> list[tuple[str, str, ast.expr | None, str]]:
    """(name, annotation, default expression, doc string beneath it) of each annotated field."""
    out = []
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str) else ""
            out.append((node.target.id, ast.unparse(node.annotation), node.value, " ".join(doc.split())))
    return out


def _section_of(value: ast.expr | None) -> str | None:
    """`field(default_factory=RunConfig)` -> "RunConfig"."""
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Name):
                return kw.value.id
    return None


def _default(value: ast.expr | None) -> str:
    if value is None:
        return "(required)"
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == "default_factory":
                factory = kw.value
                body = factory.body if isinstance(factory, ast.Lambda) else factory
                return {"dict": "{}", "list": "[]"}.get(ast.unparse(body), ast.unparse(body))
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value or "''"
    text = ast.unparse(value)
    return {"None": "null", "True": "true", "False": "false"}.get(text, text)


def experiments() -> dict[str, str]:
    """Each experiment's name and the first sentence of the comment that opens its file."""
    out = {}
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if "@package" not in line:
                comment.append(line.lstrip("# ").strip())
        out[path.stem] = _first_sentence(" ".join(comment))
    return out


def groups() -> dict[str, tuple[list[str], str | None]]:
    """Each config group (but experiment): its options and the one config.yaml chooses."""
    chosen = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)\s*$", (CONF_DIR / "config.yaml").read_text(), re.M))
    return {d.name: (sorted(f.stem for f in d.glob("*.yaml")), chosen.get(d.name))
            for d in sorted(CONF_DIR.iterdir()) if d.is_dir() and d.name != "experiment"}


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?\.)(\s|$)", text)
    return (match.group(1) if match else text).rstrip(":")


def overview() -> str:
    every = keys()
    lines = [
        "usage: python -m resilient_slurm.launch +experiment=NAME [GROUP=OPTION ...] [KEY=VALUE ...]",
        "       python -m resilient_slurm.launch -m +experiment=NAME KEY=A,B ...   one run per point",
        "       python -m resilient_slurm.launch --help SECTION|KEY                 every key of a section, or one",
        "",
        "Launching an existing run name resumes it; Ctrl-C (like SIGTERM) saves at the next step and exits 75.",
        "",
        "experiments (+experiment=NAME):",
    ]
    names = experiments()
    width = max(map(len, names), default=0) + 4
    lines += [_entry(f"  {n}", text, width) for n, text in names.items()]
    lines += ["", "groups (GROUP=OPTION; * the default):"]
    for name, (options, chosen) in groups().items():
        lines.append(f"  {name:<12}" + ", ".join(o + ("*" if o == chosen else "") for o in options))
    sections = sorted({k.split(".")[0] for k in every if "." in k})
    lines += ["", f"main keys (KEY=VALUE; --help SECTION for the others: {', '.join(sections)}):"]
    lines += [_key_line(every[k], first_only=True) for k in MAIN_KEYS if k in every]
    return "\n".join(lines) + "\n"


def topic(name: str) -> str | None:
    """Every key of a section (`checkpoint`, `model.lora`) or one key, with its whole doc; None if
    `name` is neither."""
    every = keys()
    chosen = [k for k in every if k == name or k.startswith(name + ".")]
    if not chosen:
        return None
    return "\n".join(_key_line(every[k], first_only=False) for k in chosen) + "\n"


def unknown_topic(name: str) -> str:
    every = keys()
    known = sorted(set(every) | {k.rsplit(".", 1)[0] for k in every if "." in k})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "run --help for the sections"
    return f"--help {name}: no such section or key; {hint}"


def _key_line(k: Key, first_only: bool) -> str:
    doc = _first_sentence(k.doc) if first_only else k.doc
    return _entry(f"  {k.name}={k.default}  ({k.type})", doc, 44)


def _entry(head: str, text: str, column: int) -> str:
    """`head` and `text` side by side from `column` on, or `text` beneath a longer `head`."""
    if not text:
        return head
    indent = " " * 6
    if len(head) < column:
        return textwrap.fill(f"{head:<{column}}{text}", WIDTH, subsequent_indent=indent)
    return head + "\n" + textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent)
