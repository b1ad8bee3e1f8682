"""`metrics.jsonl`: one line per training step, readable without any tracking server.

A resumed run first drops the lines after the step it resumed from (they belong to work that was
lost), so the file's steps stay strictly increasing across restarts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class MetricsFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = [line for line in read_metrics(self.path) if line["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, self.path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows; a torn last line (the writer was killed mid-line) is skipped."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
