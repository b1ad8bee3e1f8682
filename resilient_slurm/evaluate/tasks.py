"""The task definitions an evaluation can use with nothing to download: the two tiny tasks the
package ships (`tiny_mmlu` in MMLU's multiple-choice format, `tiny_gsm8k` in GSM8K's generative
one, both made up), and the user's own YAML directory (`eval.harness.include_path`).

A task YAML with `dataset_path: json` reads its `data_files` through `datasets`, which resolves a
relative path against the working directory, not the YAML. The shipped YAMLs name their data
relative to themselves, so `localized` writes copies with absolute paths into the evaluation's own
work directory; a user's YAMLs are read where they are (give them absolute `data_files`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "tasks"
SHIPPED = ("tiny_mmlu", "tiny_gsm8k")
_DATA_FILE = re.compile(r"^(\s+test:\s*)(\S+\.jsonl)\s*$", re.MULTILINE)


def shipped_yaml(task: str) -> Path:
    return SHIPPED_DIR / f"{task}.yaml"


def localized(out_dir: Path) -> Path:
    """Copies of the shipped task YAMLs in `out_dir`, their data files named by absolute path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for task in SHIPPED:
        text = shipped_yaml(task).read_text()
        text = _DATA_FILE.sub(lambda m: m.group(1) + str(SHIPPED_DIR / m.group(2)), text)
        (out_dir / f"{task}.yaml").write_text(text)
    return out_dir


def include_paths(work_dir: Path, user_dir: str) -> list[str]:
    """Where lm-eval looks for task YAMLs besides its own: the shipped tasks, then the user's."""
    paths = [str(localized(work_dir / "tasks"))]
    if user_dir:
        if not os.path.isdir(user_dir):
            raise FileNotFoundError(f"eval.harness.include_path: {user_dir} is not a directory; point it at a "
                                    "directory of task YAMLs")
        paths.append(user_dir)
    return paths
